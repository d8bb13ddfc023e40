// Talking to the server: the API key, and server-sent events read through fetch().
// An EventSource cannot send an Authorization header, so both the chat stream and the
// engine's event stream are read with fetch, which can. The key lives in sessionStorage:
// it is gone when the tab closes, and it never goes into a URL.

const KEY = "rawpage.apiKey";

export const api = {
  get key() {
    return sessionStorage.getItem(KEY) || "";
  },
  set key(value) {
    sessionStorage.setItem(KEY, value);
  },
  headers(extra = {}) {
    return this.key ? { ...extra, Authorization: `Bearer ${this.key}` } : extra;
  },
  async json(path, options = {}) {
    const response = await fetch(path, { ...options, headers: this.headers(options.headers) });
    const body = await response.json();
    if (!response.ok) throw new ApiError(response.status, body?.error?.message || response.statusText);
    return body;
  },
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Calls onEvent(name, data) for each event of a text/event-stream response body, until it
// ends or the signal aborts. `name` is "message" where the event has no `event:` line.
export async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const raw = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of raw.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}
