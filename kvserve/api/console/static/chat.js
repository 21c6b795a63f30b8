// Chat playground over the server's own Chat Completions API (streaming).
import { apiFetch } from "./api.js";

const history = [];  // OpenAI messages of the conversation so far (images stay in it: resent each turn)
const pendingCalls = [];  // tool calls of the last answer that still need a result (the next sends)
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
let pendingImages = [];  // data: URIs attached to the message being written
let takesImages = false;  // the served model's /v1/models modalities.vision
let controller = null;
let numSent = 0;

const $ = (id) => document.getElementById(id);

function settings() {
  const number = (id) => {
    const text = $(id).value.trim();
    return text === "" ? null : Number(text);
  };
  const body = {
    temperature: number("set-temperature"),
    top_p: number("set-top_p"),
    max_tokens: number("set-max_tokens"),
    seed: number("set-seed"),
  };
  const topK = number("set-top_k");
  if (topK) body.top_k = topK;
  const tools = $("set-tools").value.trim();
  if (tools) body.tools = JSON.parse(tools);  // a SyntaxError is shown under the settings
  for (const key of Object.keys(body)) if (body[key] === null) delete body[key];
  return body;
}

function bubble(role, text = "", images = []) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  if (images.length) div.append(thumbnails(images));
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// Small previews; `remove(index)` adds a button to each that drops it.
function thumbnails(images, remove = null) {
  const row = document.createElement("div");
  row.className = "thumbs";
  images.forEach((uri, index) => {
    const item = document.createElement("span");
    const img = document.createElement("img");
    img.src = uri;  // only data:image/... URIs read from the user's own files (readImage)
    img.alt = "attached image";
    item.append(img);
    if (remove) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "×";
      button.title = "Remove";
      button.addEventListener("click", () => remove(index));
      item.append(button);
    }
    row.append(item);
  });
  return row;
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => (String(reader.result).startsWith("data:image/") ? resolve(reader.result) : reject(new Error("not an image")));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  if (!takesImages) return;
  for (const file of files) {
    if (IMAGE_TYPES.includes(file.type)) pendingImages.push(await readImage(file));
  }
  showPending();
}

function showPending() {
  $("attachments").replaceChildren(thumbnails(pendingImages, (index) => {
    pendingImages.splice(index, 1);
    showPending();
  }));
}

// The model takes images: show the attach control (paste and drop work only then too).
export function setImageInput(enabled) {
  takesImages = enabled;
  $("attach").hidden = !enabled;
}

// A message's content: the text alone, or OpenAI content parts with the images first.
function messageContent(text, images) {
  if (!images.length) return text;
  const parts = images.map((url) => ({ type: "image_url", image_url: { url } }));
  return text ? [...parts, { type: "text", text }] : parts;
}

// One assistant message being streamed: folded reasoning, text, tool calls, usage.
class AssistantView {
  constructor() {
    this.root = bubble("assistant");
    this.reasoning = null;
    this.text = document.createElement("span");
    this.text.className = "content";
    this.root.append(this.text);
    this.calls = new Map();
  }
  addReasoning(text) {
    if (!this.reasoning) {
      const details = document.createElement("details");
      const summary = document.createElement("summary");  // no innerHTML: the CSP's Trusted Types forbid it
      summary.textContent = "reasoning";
      details.append(summary);
      this.reasoning = document.createElement("div");
      details.append(this.reasoning);
      this.root.prepend(details);
    }
    this.reasoning.textContent += text;
  }
  addText(text) { this.text.textContent += text; }
  addToolCall(delta) {
    let call = this.calls.get(delta.index);
    if (!call) {
      const div = document.createElement("div");
      div.className = "tool-call";
      call = { div, id: delta.id, name: "", args: "" };
      this.calls.set(delta.index, call);
      this.root.append(div);
    }
    if (delta.function?.name) call.name += delta.function.name;
    if (delta.function?.arguments) call.args += delta.function.arguments;
    call.div.textContent = `tool call ${call.name}(${call.args})`;
  }
  setUsage(usage, ttftMs, tokPerS, finish) {
    const div = document.createElement("div");
    div.className = "usage";
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    div.textContent = `prompt ${usage.prompt_tokens} · cached ${cached} · generated ${usage.completion_tokens}`
      + ` · TTFT ${ttftMs.toFixed(0)} ms · ${tokPerS.toFixed(1)} tok/s · ${finish}`;
    div.dataset.cached = cached;
    this.root.append(div);
  }
  fail(message) {
    this.root.classList.add("error");
    this.text.textContent += `\n[${message}]`;
  }
}

// Reads an SSE body and calls onData with each `data:` payload (comments are keepalives).
async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") onData(JSON.parse(data));
    }
  }
}

async function send(text, images = []) {
  let options;
  try {
    options = settings();
    $("settings-error").textContent = "";
  } catch (error) {
    $("settings-error").textContent = `tools: ${error.message}`;
    return;
  }
  const call = pendingCalls.shift();
  if (call) {
    bubble("tool", `${call.function.name} → ${text}`, images);
    history.push({ role: "tool", tool_call_id: call.id, content: messageContent(text, images) });
  } else {
    bubble("user", text, images);
    history.push({ role: "user", content: messageContent(text, images) });
  }
  updatePlaceholder();
  if (pendingCalls.length) return;  // every call of the turn needs its result before the model goes on
  const system = $("set-system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...history] : [...history];
  const view = new AssistantView();
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstAt = null, lastAt = null, usage = null, finish = "", content = "", reasoning = "";
  const toolCalls = [];
  try {
    const response = await apiFetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", "x-request-id": `console-${Date.now()}-${++numSent}` },
      body: JSON.stringify({
        model: window.kvserveModel || "kvserve", messages, stream: true,
        stream_options: { include_usage: true }, ...options,
      }),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error?.message || `HTTP ${response.status}`);
    }
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        const hasToken = delta.content || delta.reasoning_content || delta.tool_calls;
        if (hasToken) { firstAt ??= performance.now(); lastAt = performance.now(); }
        if (delta.reasoning_content) { reasoning += delta.reasoning_content; view.addReasoning(delta.reasoning_content); }
        if (delta.content) { content += delta.content; view.addText(delta.content); }
        for (const call of delta.tool_calls || []) {
          view.addToolCall(call);
          toolCalls[call.index] ??= { id: call.id, type: "function", function: { name: "", arguments: "" } };
          if (call.function?.name) toolCalls[call.index].function.name += call.function.name;
          if (call.function?.arguments) toolCalls[call.index].function.arguments += call.function.arguments;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      view.root.scrollIntoView({ block: "end" });
    });
    const message = { role: "assistant", content };
    if (reasoning) message.reasoning_content = reasoning;
    if (toolCalls.length) message.tool_calls = toolCalls.filter(Boolean);
    history.push(message);
    pendingCalls.push(...(message.tool_calls || []));
    if (usage) {
      const ttft = (firstAt ?? performance.now()) - started;
      const decodeS = firstAt && lastAt > firstAt ? (lastAt - firstAt) / 1000 : 0;
      const tokPerS = decodeS > 0 ? (usage.completion_tokens - 1) / decodeS : 0;
      view.setUsage(usage, ttft, tokPerS, finish);
    }
  } catch (error) {
    history.pop();  // the turn did not happen: the next send starts from the same history
    view.fail(error.name === "AbortError" ? "stopped" : error.message);
  } finally {
    controller = null;
    setBusy(false);
    updatePlaceholder();
  }
}

function updatePlaceholder() {
  const call = pendingCalls[0];
  $("chat-input").placeholder = call
    ? `Result of tool call ${call.function.name}(${call.function.arguments}) (sent as a tool message)`
    : "Message (Enter sends, Shift+Enter: new line)";
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

export function initChat() {
  $("chat-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("chat-input").value.trim();
    if ((!text && !pendingImages.length) || controller) return;
    $("chat-input").value = "";
    const images = pendingImages;
    pendingImages = [];
    showPending();
    send(text, images);
  });
  $("attach").addEventListener("click", () => $("attach-input").click());
  $("attach-input").addEventListener("change", async (event) => {
    await attach([...event.target.files]);
    event.target.value = "";  // the same file again is a change too
  });
  $("chat-input").addEventListener("paste", (event) => {
    const files = [...event.clipboardData.files];
    if (files.length && takesImages) {
      event.preventDefault();
      attach(files);
    }
  });
  $("chat-form").addEventListener("dragover", (event) => {
    if (takesImages) event.preventDefault();  // allows the drop
  });
  $("chat-form").addEventListener("drop", (event) => {
    if (!takesImages) return;
    event.preventDefault();
    attach([...event.dataTransfer.files]);
  });
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("clear").addEventListener("click", () => {
    controller?.abort();
    history.length = 0;
    pendingCalls.length = 0;
    pendingImages = [];
    showPending();
    updatePlaceholder();
    $("messages").replaceChildren();
  });
}
