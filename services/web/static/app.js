// The page: talk to the agent through the web service's WebSocket bridge and
// watch the four streams live. Everything a test needs to read is kept in
// window.kameState (and mirrored in data- attributes of <body>).
import { MicrophoneError, openAudio } from "./audio.js";
import { Timeline } from "./timeline.js";

// The caller is talking when the microphone is this loud (dBFS). A barge-in
// (the gateway's barge_in event: the caller cut the agent off) drops the agent
// audio queued here.
const TALKING_DB = -45;
const TALKING_HOLD_MS = 400;

const $ = (id) => document.getElementById(id);
const ui = {
  mode: $("mode"),
  llm: $("llm"),
  token: $("token"),
  start: $("start"),
  stop: $("stop"),
  mute: $("mute"),
  status: $("status"),
  error: $("error"),
  caller: $("caller-text"),
  agent: $("agent-text"),
  turns: $("turns"),
  notices: $("notices"),
};
const timeline = new Timeline($("timeline"));

const state = (window.kameState = freshState("idle"));
let session = null;
// A refusal with the gateway's retry hint (the stack is starting or busy): Start
// waits, counting down, until then (performance.now() ms).
let retryAt = 0;

function freshState(status) {
  return {
    status, // idle, connecting, live, ended, error
    error: "",
    sessionId: "",
    engine: "",
    callerLevelDb: -120,
    muted: false,
    agentSpeaking: false,
    agentOutputLevel: 0, // RMS of what the page played in the last 50 ms
    agentOutputMax: 0, // the highest of those since the start
    bufferedMs: 0,
    underruns: 0,
    partial: "",
    finals: [],
    agentWords: [],
    oracle: [], // {op, generation, text}
    turns: [], // TurnSummary fields
    // What the agent said of each oracle candidate, with the transcript it answers:
    // {generation, source_text, words} (hold phrases, generation 0, left out).
    answered: [],
    notices: [],
    bargeIns: 0,
    retryAfterS: 0, // the gateway's hint in the last error: try again in this many seconds
    // Everything on one clock, seconds since Start, like `kame talk`'s timeline: the bridge's
    // events, agent_audio_start/stop, caller_talking_start/stop, barge_in.
    events: [],
  };
}

function setState(changes) {
  Object.assign(state, changes);
  document.body.dataset.status = state.status;
  document.body.dataset.agentOutputMax = state.agentOutputMax.toFixed(4);
  document.body.dataset.finals = String(state.finals.length);
  document.body.dataset.agentWords = String(state.agentWords.length);
  ui.status.textContent = state.status + (state.engine ? ` (engine ${state.engine})` : "");
  ui.error.textContent = state.error;
  ui.error.hidden = !state.error;
  const inCall = state.status === "connecting" || state.status === "live";
  const waitS = Math.ceil((retryAt - performance.now()) / 1000);
  ui.start.disabled = inCall || waitS > 0;
  ui.start.textContent = waitS > 0 ? `Try again in ${waitS} s` : "Start talking";
  ui.stop.disabled = !inCall;
  ui.mute.disabled = state.status !== "live";
  ui.mute.textContent = state.muted ? "Unmute" : "Mute";
}

async function loadConfig() {
  try {
    const config = await (await fetch("/config.json")).json();
    fillSelect(ui.mode, config.modes);
    fillSelect(ui.llm, ["", ...config.llm_models], (m) => m || "the oracle's own");
  } catch (error) {
    setState({ status: "error", error: `cannot reach the web service: ${error.message}` });
  }
}

function fillSelect(select, values, label = (v) => v) {
  select.replaceChildren(
    ...values.map((value) => {
      const option = document.createElement("option");
      option.value = value;
      option.textContent = label(value);
      return option;
    }),
  );
}

class Session {
  constructor() {
    this.t0 = performance.now();
    this.lastTalking = -Infinity;
    this.lastLoudT = 0;
    this.talking = false;
    this.audio = null;
    this.socket = null;
  }

  now() {
    return (performance.now() - this.t0) / 1000;
  }

  async start() {
    this.audio = await openAudio({
      onCapture: (pcm, level) => this.onCapture(pcm, level),
      onPlayed: (report) => this.onPlayed(report),
    });
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    this.socket = new WebSocket(`${scheme}://${location.host}/converse`);
    this.socket.binaryType = "arraybuffer";
    this.socket.onopen = () => {
      this.socket.send(
        JSON.stringify({
          type: "start",
          mode: ui.mode.value,
          llm: ui.llm.value,
          rate: this.audio.rate,
          token: ui.token.value.trim(),
        }),
      );
      setState({ status: "live" });
    };
    this.socket.onmessage = (event) => this.onMessage(event.data);
    this.socket.onerror = () => {
      if (!state.error) setState({ status: "error", error: "cannot reach the web service" });
    };
    this.socket.onclose = () => this.close(state.status === "error" ? "error" : "ended");
  }

  onCapture(pcm, level) {
    const t = this.now();
    if (level > TALKING_DB) {
      this.lastTalking = performance.now();
      this.lastLoudT = t; // the caller's end of speech, once the agent answers
    }
    if (this.callerTalking() !== this.talking) {
      this.talking = !this.talking;
      state.events.push({ t, type: this.talking ? "caller_talking_start" : "caller_talking_stop" });
    }
    state.callerLevelDb = level;
    timeline.callerLevel(t, level);
    if (this.socket && this.socket.readyState === WebSocket.OPEN && state.status === "live") {
      this.socket.send(pcm);
    }
  }

  onPlayed({ level, bufferedMs, underruns }) {
    timeline.agentLevel(this.now(), level);
    state.agentOutputLevel = level;
    state.bufferedMs = bufferedMs;
    state.underruns = underruns;
    if (level > state.agentOutputMax) setState({ agentOutputMax: level });
  }

  onMessage(data) {
    if (data instanceof ArrayBuffer) {
      this.onAgentAudio(data);
      return;
    }
    const event = JSON.parse(data);
    const t = this.now();
    state.events.push({ t, ...event });
    if (event.type === "barge_in") {
      // What is still queued here would talk over the caller.
      this.audio.flush();
    }
    const handler = HANDLERS[event.type];
    if (handler) handler(event, t);
  }

  onAgentAudio(data) {
    const speaking = new Uint8Array(data, 0, 1)[0] === 1;
    const t = this.now();
    if (speaking !== state.agentSpeaking) {
      state.events.push({ t, type: speaking ? "agent_audio_start" : "agent_audio_stop" });
    }
    state.agentSpeaking = speaking;
    this.audio.play(data.slice(1));
  }

  async toggleMute() {
    if (state.muted) {
      await this.audio.unmute();
    } else {
      this.audio.mute();
    }
    state.events.push({ t: this.now(), type: state.muted ? "unmuted" : "muted" });
    setState({ muted: !state.muted });
  }

  callerTalking() {
    return performance.now() - this.lastTalking < TALKING_HOLD_MS;
  }

  stop() {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ type: "stop" }));
    }
  }

  async close(status) {
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) this.socket.close();
    if (this.audio) await this.audio.close();
    this.audio = null;
    if (session === this) session = null;
    setState({ status });
  }
}

const HANDLERS = {
  barge_in(_event, t) {
    state.bargeIns += 1;
    timeline.mark(3, t, "barge-in", "#805ad5");
    setState({});
  },
  started(event) {
    setState({ sessionId: event.session_id, engine: event.engine });
  },
  user_partial(event, t) {
    state.partial = event.text;
    timeline.mark(1, t, event.text, "#8a8a8a");
    $("caller-partial").textContent = state.partial;
    setState({});
  },
  user_final(event, t) {
    state.finals.push(event.text.trim());
    state.partial = "";
    addLine(ui.caller, event.text.trim());
    timeline.mark(1, t, event.text.trim(), "#111111");
    $("caller-partial").textContent = state.partial;
    setState({});
  },
  oracle_reset(event, t) {
    state.oracle.push({
      op: "reset",
      generation: event.generation,
      text: event.text,
      source_text: event.source_text,
    });
    timeline.mark(2, t, `RESET ${event.text}`, "#c53030");
  },
  oracle_append(event, t) {
    state.oracle.push({ op: "append", generation: event.generation, text: event.text });
    timeline.mark(2, t, `+ ${event.text}`, "#dd6b20");
  },
  agent_text(event, t) {
    state.agentWords.push(event.text);
    if (!event.filler && event.generation) answerOf(event.generation).words.push(event.text);
    ui.agent.textContent = state.agentWords.join(" ");
    timeline.mark(3, t, event.text, "#2f855a");
    setState({});
  },
  turn(event, t) {
    state.turns.push(event);
    const answer = event.answer_latency_s ? `, answer ${event.answer_latency_s.toFixed(2)} s` : "";
    // The latencies run from the caller's end of speech, which the page heard last.
    const speechEnd = session ? session.lastLoudT : t;
    timeline.latency(speechEnd, event.response_latency_s, `${event.response_latency_s.toFixed(2)} s${answer}`);
    addLine(
      ui.turns,
      `"${event.user_text}": first audio ${event.response_latency_s.toFixed(2)} s${answer}`,
    );
  },
  notice(event) {
    state.notices.push(event);
    addLine(ui.notices, `${event.kind}: ${event.message}`);
  },
  error(event) {
    setState({ status: "error", error: event.message, retryAfterS: event.retry_after_s || 0 });
    if (event.retry_after_s) countDown(event.retry_after_s);
  },
  end() {
    setState({ status: "ended" });
  },
};

function countDown(seconds) {
  retryAt = performance.now() + seconds * 1000;
  const tick = setInterval(() => {
    setState({});
    if (performance.now() >= retryAt) clearInterval(tick);
  }, 250);
  setState({});
}

function answerOf(generation) {
  let answer = state.answered.find((a) => a.generation === generation);
  if (!answer) {
    const reset = state.oracle.find((u) => u.op === "reset" && u.generation === generation);
    answer = { generation, source_text: reset ? reset.source_text : "", words: [] };
    state.answered.push(answer);
  }
  return answer;
}

function addLine(list, text) {
  const item = document.createElement("li");
  item.textContent = text;
  list.append(item);
  list.scrollTop = list.scrollHeight;
}

ui.start.addEventListener("click", async () => {
  Object.assign(state, freshState("connecting"), { status: "connecting" });
  for (const list of [ui.caller, ui.turns, ui.notices]) list.replaceChildren();
  ui.agent.textContent = "";
  timeline.reset();
  setState({});
  session = new Session();
  try {
    await session.start();
  } catch (error) {
    const message = error instanceof MicrophoneError ? error.message : `cannot start: ${error.message}`;
    setState({ status: "error", error: message });
    if (session) await session.close("error");
  }
});
ui.stop.addEventListener("click", () => session && session.stop());
ui.mute.addEventListener("click", async () => {
  try {
    if (session) await session.toggleMute();
  } catch (error) {
    setState({ error: error.message });
  }
});
$("controls").addEventListener("submit", (event) => event.preventDefault()); // Enter in the token field

let shownUntil = 0; // the timeline stays where the last conversation ended
function frame() {
  if (session) shownUntil = session.now();
  timeline.draw(shownUntil);
  requestAnimationFrame(frame);
}

setState({});
loadConfig();
requestAnimationFrame(frame);
