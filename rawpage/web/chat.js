// The chat: a conversation kept in localStorage, streamed replies from
// /v1/chat/completions, a Stop button, and time to first token and tokens/s per reply.
import { api, readEvents } from "/web/api.js";
import { imagesReady, initImages, takeImages, thumbnails } from "/web/images.js";
import { renderMarkdown } from "/web/markdown.js";

const STORE = "rawpage.conversation";
const $ = (id) => document.getElementById(id);

let model = "";
let modelKnown; // resolves the promise below, once the page knows the model's name
const ready = new Promise((resolve) => (modelKnown = resolve));
let conversation = []; // [{role, content}], as the API takes it (content: text, or image and text parts)
let controller = null; // aborts the reply in flight

// Called before the page's start-up fetches, so that Send works from the first moment: a
// message sent before the model is known waits for it (chatReady). Until this runs, Send is
// disabled in the HTML; a native submit would reload the page and lose the text.
export function initChat() {
  conversation = JSON.parse(localStorage.getItem(STORE) || "[]");
  for (const m of conversation) addMessage(m.role, m.content);
  initImages();
  $("chat-form").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("clear").addEventListener("click", () => {
    controller?.abort();
    conversation = [];
    save();
    $("messages").replaceChildren();
    $("chat-stats").textContent = "";
  });
  $("send").disabled = false;
}

// The model's name, and whether it takes images, from /v1/models: replies can be asked for.
export function chatReady(modelName, takesImages) {
  model = modelName;
  imagesReady(modelName, takesImages);
  modelKnown();
}

// Images make a conversation big: past the browser's storage quota (about 5 MB) it is kept
// with each image replaced by a note, so a reload shows, and goes on from, the text alone.
function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(conversation));
  } catch {
    const note = { type: "text", text: "[an image, not kept: too big for the browser's storage]" };
    const textOnly = conversation.map((m) =>
      Array.isArray(m.content) ? { ...m, content: m.content.map((p) => (p.type === "image_url" ? note : p)) } : m,
    );
    localStorage.setItem(STORE, JSON.stringify(textOnly));
  }
}

function addMessage(role, content) {
  const node = document.createElement("div");
  node.className = `message ${role}`;
  if (role === "assistant") {
    node.dataset.testid = "reply";
    renderMarkdown(content, node);
  } else if (Array.isArray(content)) {
    const urls = content.filter((p) => p.type === "image_url").map((p) => p.image_url.url);
    node.append(thumbnails(urls), content.filter((p) => p.type === "text").map((p) => p.text).join("\n"));
  } else {
    node.textContent = content;
  }
  $("messages").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

async function send() {
  const text = $("prompt").value.trim();
  if (controller || !(text || $("attachments").childElementCount)) return;
  $("prompt").value = "";
  const images = takeImages().map((url) => ({ type: "image_url", image_url: { url } }));
  const message = images.length ? [...images, ...(text ? [{ type: "text", text }] : [])] : text;
  conversation.push({ role: "user", content: message });
  save();
  addMessage("user", message);
  const reply = addMessage("assistant", "");
  reply.classList.add("streaming");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let content = "";
  try {
    await ready;
    content = await streamReply(reply, controller.signal);
  } catch (e) {
    if (e.name === "AbortError") reply.append(stoppedNote());
    else reply.append(errorNote(e.refused ? `${e.message} (not kept in the conversation)` : e.message));
    // A message the server refused (too long, too many images...) would be refused again with
    // every later one: the conversation goes on without it.
    if (e.refused) conversation.pop();
  } finally {
    content = content || reply.dataset.text || "";
    if (content) conversation.push({ role: "assistant", content });
    save();
    reply.classList.remove("streaming");
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

// Streams one reply into `node`; returns its text. Rendering waits for the next frame, so
// a fast stream re-renders the Markdown at most once per frame.
async function streamReply(node, signal) {
  const body = {
    model,
    messages: conversation,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    max_tokens: Number($("max-tokens").value),
  };
  const start = performance.now();
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: api.headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) {
    const err = await response.json().catch(() => ({}));
    throw Object.assign(new Error(err?.error?.message || `HTTP ${response.status}`), { refused: response.status === 400 });
  }
  let text = "";
  let firstToken = null;
  let tokens = 0;
  let pending = false;
  await readEvents(response, (_, data) => {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message);
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    const delta = chunk.choices?.[0]?.delta?.content;
    if (!delta) return;
    firstToken ??= performance.now();
    text += delta;
    node.dataset.text = text;
    if (!pending) {
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        renderMarkdown(node.dataset.text, node);
      });
    }
  });
  renderMarkdown(text, node);
  showStats(start, firstToken, performance.now(), tokens);
  return text;
}

function showStats(start, firstToken, end, tokens) {
  if (firstToken === null) return;
  const ttft = (firstToken - start) / 1000;
  const rate = tokens > 1 ? (tokens - 1) / ((end - firstToken) / 1000) : 0;
  $("chat-stats").textContent = `time to first token ${ttft.toFixed(2)} s · ${rate.toFixed(1)} tokens/s · ${tokens} tokens`;
}

// The reply was cut short by Stop: say so, or it reads as the model's whole answer.
function stoppedNote() {
  const note = document.createElement("div");
  note.className = "stopped";
  note.dataset.testid = "stopped";
  note.textContent = "[stopped]";
  return note;
}

function errorNote(message) {
  const note = document.createElement("div");
  note.className = "error";
  note.textContent = message;
  return note;
}
