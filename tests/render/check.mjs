// Runs the page's rendering rule (src/http/ui/render.js) against the shared
// fixture (src/render/cases.json), which the Rust rule passes in its unit
// tests, and checks that dom.js shows every string through it; run by
// tests/render.rs with Node.js. Prints one JSON object:
// {cases, failures, known_scripts, scripts, uncovered} and exits 1 on a failure.

import { readFileSync } from 'node:fs';
import { display, displayJson, escapedJson, isHidden, Warnings, SCRIPTS, knownScripts } from '../../src/http/ui/render.js';

const fixture = new URL('../../src/render/cases.json', import.meta.url);
const cases = JSON.parse(readFileSync(fixture, 'utf8'));
const failures = [];
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

for (const c of cases) {
  let shown;
  const w = new Warnings();
  if ('text' in c) {
    shown = display(c.text, Boolean(c.multiline));
    w.text('', c.text);
  } else {
    shown = displayJson(c.json);
    w.json('', c.json);
  }
  const warnings = w.finish();
  if (shown !== c.display) failures.push({ name: c.name, what: 'display', got: shown, want: c.display });
  if (!same(warnings, c.warnings)) failures.push({ name: c.name, what: 'warnings', got: warnings, want: c.warnings });
}

// What a person edits (the card's argument editor) shows every hidden
// character as a JSON escape and parses back to the exact value.
for (const c of cases.filter((x) => 'json' in x)) {
  const text = escapedJson(c.json);
  const back = JSON.parse(text);
  if (!same(back, c.json) || [...text].some((ch) => ch !== '\n' && isHidden(ch))) {
    failures.push({ name: c.name, what: 'escapedJson', got: text });
  }
}

// Every letter, mark and digit this engine knows belongs to a script of
// SCRIPTS or to every script: the list of names is complete for the engine.
const known = knownScripts();
const covered = `[\\p{scx=Zyyy}\\p{scx=Zinh}${known.map((s) => `\\p{scx=${s}}`).join('')}]`;
const outside = new RegExp(`[[\\p{L}\\p{M}\\p{N}]--${covered}]`, 'v');
const uncovered = [];
for (let cp = 0; cp <= 0x10ffff && uncovered.length < 20; cp += 1) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const c = String.fromCodePoint(cp);
  if (outside.test(c)) uncovered.push(`U+${cp.toString(16).toUpperCase().padStart(4, '0')}`);
}
if (uncovered.length) failures.push({ what: 'letters of no listed script', uncovered });

// dom.js's h() and append() show every string through the rule, keep form
// values exact, and render an approval's warnings: checked on a stand-in
// for the DOM that records what the page would put in it.
class FakeNode {}
class FakeElement extends FakeNode {
  constructor(tag) { super(); this.tag = tag; this.children = []; this.attributes = {}; this.dataset = {}; }
  set textContent(t) { this.children = [new FakeText(t)]; }
  get textContent() { return this.children.map((c) => c.textContent).join(''); }
  setAttribute(k, v) { this.attributes[k] = v; }
  addEventListener() {}
  append(...nodes) { this.children.push(...nodes); }
}
class FakeText extends FakeNode {
  constructor(t) { super(); this.data = t; }
  get textContent() { return this.data; }
}
globalThis.Node = FakeNode;
globalThis.document = {
  createElement: (tag) => new FakeElement(tag),
  createTextNode: (t) => new FakeText(t),
};
const { h, append, setText, warningsBlock } = await import('../../src/http/ui/dom.js');
const page = [];
const el = h('p', { title: 'a\u202eb', text: undefined, value: 'x\u200by' }, 'ls\u200b; rm', ['\u2066n\u2069'], 3);
page.push([el.attributes.title, 'a⟨U+202E⟩b']);
page.push([el.value, 'x\u200by']);
page.push([el.textContent, 'ls⟨U+200B⟩; rm⟨U+2066⟩n⟨U+2069⟩3']);
page.push([h('span', { text: 'q\u202e' }).textContent, 'q⟨U+202E⟩']);
page.push([append(h('pre'), 'line\n\u202e').textContent, 'line\n⟨U+202E⟩']);
page.push([setText(h('h1'), 't\ufeff').textContent, 't⟨U+FEFF⟩']);
const block = warningsBlock([{ code: 'hidden_characters', field: '/arguments/k\u200b', message: 'contains hidden or direction-changing characters: U+200B' }]);
page.push([block && block.textContent.includes('/arguments/k⟨U+200B⟩: contains hidden or direction-changing characters: U+200B'), true]);
page.push([warningsBlock([]), null]);
for (const [got, want] of page) {
  if (got !== want) failures.push({ what: 'dom.js', got, want });
}

console.log(JSON.stringify({ cases: cases.length, failures, known_scripts: known.length, scripts: SCRIPTS, uncovered }));
process.exit(failures.length ? 1 : 0);
