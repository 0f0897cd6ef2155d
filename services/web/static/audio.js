// The page's audio: one AudioContext for the microphone and the agent's voice,
// so both run at the context's rate (the bridge asks the gateway for exactly
// that rate both ways, and nothing here resamples).

export class MicrophoneError extends Error {}

// What getUserMedia's failures mean to a person.
const MIC_ERRORS = {
  NotAllowedError: "no microphone: the browser (or you) refused access to it",
  NotFoundError: "no microphone: this computer has none the browser can use",
  NotReadableError: "no microphone: another program holds it",
  SecurityError: "no microphone: the page must be served over https or from localhost",
};

async function openMicrophone() {
  if (!navigator.mediaDevices || !window.AudioWorkletNode) {
    throw new MicrophoneError(MIC_ERRORS.SecurityError);
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      // Echo cancellation keeps the agent's voice from the speakers out of the caller's audio.
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
  } catch (error) {
    throw new MicrophoneError(MIC_ERRORS[error.name] || `no microphone: ${error.message}`);
  }
}

export async function openAudio({ onCapture, onPlayed }) {
  let stream = await openMicrophone();
  const context = new AudioContext({ latencyHint: "interactive" });
  await context.audioWorklet.addModule("/static/capture-worklet.js");
  await context.audioWorklet.addModule("/static/player-worklet.js");
  let source = context.createMediaStreamSource(stream);
  const capture = new AudioWorkletNode(context, "kame-capture", { numberOfOutputs: 0 });
  capture.port.onmessage = (event) => onCapture(event.data.pcm, event.data.level);
  source.connect(capture);
  const player = new AudioWorkletNode(context, "kame-player", { outputChannelCount: [1] });
  player.port.onmessage = (event) => onPlayed(event.data);
  player.connect(context.destination);
  await context.resume();
  const release = () => {
    source.disconnect();
    stream.getTracks().forEach((track) => track.stop());
  };
  return {
    rate: context.sampleRate,
    // Muted, the microphone is released (the browser's recording indicator goes out) and
    // the capture node sends silence; unmuting opens it again.
    mute: release,
    async unmute() {
      stream = await openMicrophone();
      source = context.createMediaStreamSource(stream);
      source.connect(capture);
    },
    play: (pcm) => player.port.postMessage(pcm, [pcm]),
    flush: () => player.port.postMessage("flush"),
    async close() {
      release();
      await context.close();
    },
  };
}
