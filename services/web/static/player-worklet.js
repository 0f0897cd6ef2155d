// Agent playback with a small jitter buffer. PCM16 chunks arrive over the
// network in bursts (one per 80 ms gateway frame); the processor plays from a
// queue, waits for PREBUFFER_MS of audio before starting (again, after it ran
// dry), and drops the oldest audio when more than MAX_MS piles up, so the agent
// never falls behind the conversation. "flush" drops everything queued: the
// caller barged in. It reports the level of what it actually played.
const PREBUFFER_MS = 120;
const MAX_MS = 500;
const REPORT_MS = 50;

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = []; // Float32Array chunks
    this.offset = 0; // read position in queue[0]
    this.queued = 0; // samples in the queue
    this.playing = false;
    this.prebuffer = (sampleRate * PREBUFFER_MS) / 1000;
    this.max = (sampleRate * MAX_MS) / 1000;
    this.reportEvery = (sampleRate * REPORT_MS) / 1000;
    this.energy = 0;
    this.counted = 0;
    this.underruns = 0;
    this.port.onmessage = (event) => this.receive(event.data);
  }

  receive(message) {
    if (message === "flush") {
      this.queue = [];
      this.offset = 0;
      this.queued = 0;
      this.playing = false;
      return;
    }
    const pcm = new Int16Array(message);
    const samples = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 0x8000;
    this.queue.push(samples);
    this.queued += samples.length;
    while (this.queue.length > 1 && this.queued - (this.queue[0].length - this.offset) > this.max) {
      this.dropOldest();
    }
  }

  dropOldest() {
    this.queued -= this.queue[0].length - this.offset;
    this.queue.shift();
    this.offset = 0;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queued >= this.prebuffer) this.playing = true;
    let written = 0;
    while (this.playing && written < out.length && this.queue.length) {
      const head = this.queue[0];
      const count = Math.min(out.length - written, head.length - this.offset);
      out.set(head.subarray(this.offset, this.offset + count), written);
      written += count;
      this.offset += count;
      this.queued -= count;
      if (this.offset === head.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    if (this.playing && written < out.length) {
      this.playing = false; // ran dry: wait for the prebuffer again
      this.underruns++;
    }
    out.fill(0, written);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.measure(out);
    return true;
  }

  measure(out) {
    for (let i = 0; i < out.length; i++) this.energy += out[i] * out[i];
    this.counted += out.length;
    if (this.counted < this.reportEvery) return;
    const rms = Math.sqrt(this.energy / this.counted);
    this.port.postMessage({
      level: rms,
      bufferedMs: (1000 * this.queued) / sampleRate,
      underruns: this.underruns,
    });
    this.energy = 0;
    this.counted = 0;
  }
}

registerProcessor("kame-player", PlayerProcessor);
