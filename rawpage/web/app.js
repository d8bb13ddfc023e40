// The page's entry point: find out whether the server wants an API key, ask for it if so,
// then start the chat and the live view of the engine.
import { api } from "/web/api.js";
import { chatReady, initChat } from "/web/chat.js";
import { startEngineView } from "/web/engine.js";

const status = document.getElementById("status");
initChat(); // before any await: a message sent during start-up waits for the model

async function main() {
  const info = await (await fetch("/web/info")).json();
  if (info.api_key_required && !api.key) await askForKey();
  let vision = false; // whether the model takes images
  for (;;) {
    try {
      const models = await api.json("/v1/models");
      document.getElementById("model").textContent = models.data[0].id;
      vision = models.data[0].vision === true;
      break;
    } catch (e) {
      if (e.status === 503) {
        status.textContent = "the model is loading";
        await new Promise((resolve) => setTimeout(resolve, 1000));
      } else if (e.status === 401) {
        status.textContent = "that key was refused";
        await askForKey();
      } else {
        throw e;
      }
    }
  }
  status.textContent = "";
  chatReady(document.getElementById("model").textContent, vision);
  startEngineView();
}

function askForKey() {
  const form = document.getElementById("key-form");
  const input = document.getElementById("api-key");
  form.hidden = false;
  input.focus();
  return new Promise((resolve) => {
    form.addEventListener(
      "submit",
      (event) => {
        event.preventDefault();
        api.key = input.value;
        input.value = "";
        form.hidden = true;
        resolve();
      },
      { once: true },
    );
  });
}

main().catch((e) => {
  status.textContent = `cannot reach the server: ${e.message}`;
});
