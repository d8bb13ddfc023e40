// A small Markdown renderer for model output. It builds DOM nodes and sets only
// textContent, never innerHTML, so nothing the model writes can become markup:
// "<script>" or "<img onerror=...>" in a reply is shown as those characters.
// It knows fenced code blocks, headings, lists, paragraphs, `code`, **bold** and *italics*.
// A fence still open (a reply being streamed) renders as code so far.

const FENCE = /^\s*```\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const LIST_ITEM = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/;
const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)/g;

export function renderMarkdown(text, container) {
  container.replaceChildren(...blocks(text.split("\n")));
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      const code = [];
      for (i++; i < lines.length && !FENCE.test(lines[i]); i++) code.push(lines[i]);
      i++; // the closing fence
      out.push(codeBlock(code.join("\n"), fence[1]));
      continue;
    }
    const heading = line.match(HEADING);
    if (heading) {
      out.push(inline(el(`h${Math.min(6, heading[1].length + 2)}`), heading[2]));
      i++;
      continue;
    }
    if (LIST_ITEM.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = el(ordered ? "ol" : "ul");
      for (; i < lines.length && LIST_ITEM.test(lines[i]); i++) {
        list.append(inline(el("li"), lines[i].match(LIST_ITEM)[2]));
      }
      out.push(list);
      continue;
    }
    if (line.trim() === "") {
      i++;
      continue;
    }
    const para = el("p");
    for (let first = true; i < lines.length && isParagraphLine(lines[i]); i++, first = false) {
      if (!first) para.append(el("br"));
      inline(para, lines[i]);
    }
    out.push(para);
  }
  return out;
}

function isParagraphLine(line) {
  return line.trim() !== "" && !FENCE.test(line) && !HEADING.test(line) && !LIST_ITEM.test(line);
}

function codeBlock(code, lang) {
  const pre = el("pre");
  const node = el("code");
  node.textContent = code;
  if (lang) pre.dataset.lang = lang;
  pre.append(node);
  return pre;
}

// Appends the text to parent as text nodes, with `code`, **bold** and *italics* as elements.
function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    parent.append(document.createTextNode(text.slice(last, m.index)));
    const [tag, inner] = m[1] ? ["code", m[1].slice(1, -1)] : m[2] ? ["strong", m[2].slice(2, -2)] : ["em", m[3].slice(1, -1)];
    const node = el(tag);
    node.textContent = inner;
    parent.append(node);
    last = m.index + m[0].length;
  }
  parent.append(document.createTextNode(text.slice(last)));
  return parent;
}

function el(tag) {
  return document.createElement(tag);
}
