// Images in the chat: the Image button (a file picker) and paste put images in the
// composer as thumbnails (click one to take it out again); Send sends them before the text
// as OpenAI `image_url` parts holding data URLs. Only for a model that takes images (its
// /v1/models card says `vision: true`); otherwise the button is hidden and a pasted image
// is refused with a note. The server's limits (rawpage/multimodal/image_input.py) are
// checked here first, so that a wrong file is refused at once, with the reason.
const MAX_IMAGE_BYTES = 20 * 1024 * 1024;
const MAX_IMAGE_PIXELS = 8192 * 8192; // width x height
const FORMATS = { "image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WebP", "image/gif": "GIF" };
const $ = (id) => document.getElementById(id);

let vision = null; // whether the model takes images; null until /v1/models has said
let model = "";
const pending = []; // the composer's images, as data URLs

export function initImages() {
  $("attach").addEventListener("click", () => $("image-file").click());
  $("image-file").addEventListener("change", (event) => {
    addFiles([...event.target.files]);
    event.target.value = ""; // picking the same file again fires "change" again
  });
  $("prompt").addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.files || [])];
    if (!files.length) return; // plain text pastes as usual
    event.preventDefault();
    addFiles(files);
  });
}

export function imagesReady(modelName, takesImages) {
  model = modelName;
  vision = takesImages;
  $("attach").hidden = !takesImages;
}

// The composer's images, taken out of it (Send calls this).
export function takeImages() {
  const urls = pending.splice(0);
  showPending();
  say("");
  return urls;
}

// A message's images as thumbnails.
export function thumbnails(urls) {
  const row = document.createElement("div");
  row.className = "thumbs";
  for (const url of urls) row.append(thumbnail(url));
  return row;
}

function thumbnail(url) {
  const img = document.createElement("img");
  img.src = url;
  img.alt = "image";
  img.dataset.testid = "thumbnail";
  return img;
}

async function addFiles(files) {
  say("");
  for (const file of files) {
    try {
      pending.push(await checked(file));
    } catch (e) {
      say(e.message);
    }
  }
  showPending();
}

// The file as a data URL, if the server would take it; else an Error saying why not.
async function checked(file) {
  const name = file.name ? `"${file.name}"` : "the pasted image";
  if (vision === null) throw new Error("the model is still loading: add the image again in a moment");
  if (!vision) throw new Error(`${model} does not take images (it has no vision tower): send text only`);
  if (!FORMATS[file.type]) {
    throw new Error(`${name} is ${file.type || "not an image"}; the server takes ${Object.values(FORMATS).join(", ")}`);
  }
  if (file.size > MAX_IMAGE_BYTES) {
    throw new Error(`${name} is ${(file.size / 2 ** 20).toFixed(1)} MiB; the server takes at most 20 MiB`);
  }
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`${name} could not be read`));
    reader.readAsDataURL(file);
  });
  const img = new Image();
  img.src = url;
  await img.decode().catch(() => {
    throw new Error(`${name} could not be decoded as ${FORMATS[file.type]}`);
  });
  if (img.naturalWidth * img.naturalHeight > MAX_IMAGE_PIXELS) {
    throw new Error(`${name} is ${img.naturalWidth}x${img.naturalHeight} pixels; the server takes at most 8192x8192`);
  }
  return url;
}

function showPending() {
  const row = $("attachments");
  row.replaceChildren(
    ...pending.map((url, i) => {
      const img = thumbnail(url);
      img.title = "click to take it out";
      img.addEventListener("click", () => {
        pending.splice(i, 1);
        showPending();
      });
      return img;
    }),
  );
}

function say(message) {
  $("image-note").textContent = message;
}
