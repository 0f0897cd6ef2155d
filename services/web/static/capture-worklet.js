// Microphone capture: float samples from the AudioContext's graph to PCM16
// chunks of CHUNK_MS for the bridge, with each chunk's RMS level (dBFS), so the
// page can draw the caller's level and notice when the caller talks. With no
// input connected (the microphone is muted) it sends silence at the same pace:
// the gateway answers each caller frame with an agent frame, so the stream of
// caller audio must not stop while the agent talks.
const QUANTUM = 128; // samples per process() call when there is no input to size it
const CHUNK_MS = 20;

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round((sampleRate * CHUNK_MS) / 1000);
    this.chunk = new Int16Array(this.size);
    this.filled = 0;
    this.energy = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    const count = channel ? channel.length : QUANTUM;
    for (let i = 0; i < count; i++) {
      const sample = channel ? Math.max(-1, Math.min(1, channel[i])) : 0;
      this.energy += sample * sample;
      this.chunk[this.filled++] = sample < 0 ? sample * 0x8000 : sample * 0x7fff;
      if (this.filled === this.size) this.flush();
    }
    return true;
  }

  flush() {
    const level = 10 * Math.log10(this.energy / this.size + 1e-12);
    const pcm = this.chunk.buffer;
    this.port.postMessage({ pcm, level }, [pcm]); // transferred: the chunk is detached now
    this.chunk = new Int16Array(this.size);
    this.filled = 0;
    this.energy = 0;
  }
}

registerProcessor("kame-capture", CaptureProcessor);
