// The four streams on one time axis, like `kame talk --plot`, scrolling live:
// caller audio level, partial/final transcripts, oracle candidates (RESET
// starts one, APPEND extends it) and the agent (its output level and words).
// Per-turn response latency is the shaded span from the caller's end of speech to
// the agent's first audio, labelled with it (and the answer's latency).

const WINDOW_S = 20;
const LANES = ["caller audio", "transcripts", "oracle", "agent"];
const COLORS = {
  caller: "#2b6cb0",
  partial: "#8a8a8a",
  final: "#111111",
  reset: "#c53030",
  append: "#dd6b20",
  agent: "#2f855a",
  latency: "rgba(128, 90, 213, 0.22)",
  grid: "#e2e2e2",
};
const LABEL_W = 96;
const TEXT_ROWS = 4;

export class Timeline {
  constructor(canvas) {
    this.canvas = canvas;
    this.reset();
  }

  reset() {
    this.callerLevels = []; // [t, dBFS]
    this.agentLevels = []; // [t, rms]
    this.marks = { 1: [], 2: [], 3: [] }; // lane -> [{t, text, color}]
    this.latencies = []; // [start t, end t, label]
  }

  callerLevel(t, db) {
    this.callerLevels.push([t, db]);
  }

  agentLevel(t, rms) {
    this.agentLevels.push([t, rms]);
  }

  mark(lane, t, text, color) {
    this.marks[lane].push({ t, text, color });
  }

  latency(from, seconds, label) {
    this.latencies.push([from, from + Math.max(0, seconds), label]);
  }

  draw(now) {
    const canvas = this.canvas;
    const scale = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (canvas.width !== width * scale || canvas.height !== height * scale) {
      canvas.width = width * scale;
      canvas.height = height * scale;
    }
    const g = canvas.getContext("2d");
    g.setTransform(scale, 0, 0, scale, 0, 0);
    g.clearRect(0, 0, width, height);
    const start = Math.max(0, now - WINDOW_S);
    const plotW = width - LABEL_W;
    const laneH = (height - 20) / LANES.length;
    const x = (t) => LABEL_W + ((t - start) / WINDOW_S) * plotW;
    this.drawGrid(g, start, x, width, height, laneH);
    for (const [from, to, label] of this.latencies) {
      if (to < start) continue;
      g.fillStyle = COLORS.latency;
      g.fillRect(x(from), 3 * laneH, Math.max(2, x(to) - x(from)), laneH);
      g.fillStyle = "#553c9a";
      g.font = "11px sans-serif";
      g.fillText(label, x(from) + 2, 3 * laneH + laneH - 6);
    }
    this.drawLevels(g, this.callerLevels, start, x, 0, laneH, (db) => (db + 70) / 70, COLORS.caller);
    this.drawLevels(g, this.agentLevels, start, x, 3 * laneH, laneH, (rms) => Math.sqrt(rms) * 2, COLORS.agent);
    for (const lane of [1, 2, 3]) this.drawMarks(g, this.marks[lane], start, x, lane * laneH, laneH);
  }

  drawGrid(g, start, x, width, height, laneH) {
    g.strokeStyle = COLORS.grid;
    g.fillStyle = "#333";
    g.font = "12px sans-serif";
    LANES.forEach((name, lane) => {
      g.beginPath();
      g.moveTo(0, lane * laneH);
      g.lineTo(width, lane * laneH);
      g.stroke();
      g.fillText(name, 6, lane * laneH + laneH / 2);
    });
    g.fillStyle = "#666";
    for (let t = Math.ceil(start); t <= start + WINDOW_S; t++) {
      g.beginPath();
      g.moveTo(x(t), 0);
      g.lineTo(x(t), height - 18);
      g.stroke();
      if (t % 2 === 0) g.fillText(`${t} s`, x(t) - 8, height - 4);
    }
  }

  drawLevels(g, levels, start, x, top, laneH, norm, color) {
    g.fillStyle = color;
    for (const [t, value] of levels) {
      if (t < start) continue;
      const h = Math.max(0, Math.min(1, norm(value))) * (laneH - 6);
      g.fillRect(x(t), top + laneH - 3 - h, 2, h);
    }
  }

  drawMarks(g, marks, start, x, top, laneH) {
    g.font = "11px sans-serif";
    marks.forEach((mark, index) => {
      if (mark.t < start) return;
      const y = top + 14 + (index % TEXT_ROWS) * ((laneH - 16) / TEXT_ROWS);
      g.fillStyle = mark.color;
      g.fillRect(x(mark.t), y - 10, 2, 12);
      g.fillText(mark.text.slice(0, 40), x(mark.t) + 4, y);
    });
  }
}
