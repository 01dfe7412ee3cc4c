// Markdown as DOM nodes: a small subset (fenced code, headings, lists,
// quotes, paragraphs; inline code, bold, italic, links). Model output is only
// ever set as textContent, so it can never run as HTML or script.
import { h } from './api.js';

export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  let para = [];
  const flush = () => {
    if (!para.length) return;
    const p = h('p');
    para.forEach((line, k) => {
      if (k) p.append(h('br'));
      inline(p, line);
    });
    out.append(p);
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const code = [];
      ++i;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i++]);
      ++i;  // the closing fence (absent while a reply is still streaming)
      const pre = h('pre', { class: 'code' });
      if (fence[2]) pre.append(h('span', { class: 'code-lang', text: fence[2] }));
      pre.append(h('code', { text: code.join('\n') }));
      out.append(pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      const el = h('h' + Math.min(6, heading[1].length + 2));
      inline(el, heading[2]);
      out.append(el);
      ++i;
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = h(ordered ? 'ol' : 'ul');
      while (i < lines.length) {
        const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (!m || /\d/.test(m[1]) !== ordered) break;
        const li = h('li');
        inline(li, m[2]);
        list.append(li);
        ++i;
      }
      out.append(list);
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      const quote = h('blockquote');
      while (i < lines.length && /^\s*>/.test(lines[i])) {
        const p = h('p');
        inline(p, lines[i].replace(/^\s*>\s?/, ''));
        quote.append(p);
        ++i;
      }
      out.append(quote);
      continue;
    }
    if (/^\s*$/.test(line)) flush(); else para.push(line);
    ++i;
  }
  flush();
  return out;
}

const INLINE = /(`+)([^`]+?)\1|\*\*([^*]+?)\*\*|__([^_]+?)__|\*([^*\s][^*]*?)\*|\[([^\]]+)\]\(([^)\s]+)\)/g;

function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    if (m[2] !== undefined) parent.append(h('code', { text: m[2] }));
    else if (m[3] !== undefined || m[4] !== undefined) parent.append(h('strong', { text: m[3] ?? m[4] }));
    else if (m[5] !== undefined) parent.append(h('em', { text: m[5] }));
    else parent.append(link(m[6], m[7]));
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

// Only http(s) links become anchors (never javascript: or data:), opened in
// a new tab without a referrer; anything else stays text.
function link(label, url) {
  let parsed = null;
  try { parsed = new URL(url); } catch (_) { /* relative or malformed */ }
  if (!parsed || (parsed.protocol !== 'https:' && parsed.protocol !== 'http:'))
    return document.createTextNode(`[${label}](${url})`);
  return h('a', { href: parsed.href, target: '_blank', rel: 'noopener noreferrer nofollow', text: label, title: parsed.href });
}
