// The one rule by which untrusted text is shown to a person: the page's copy
// of src/render.rs, which documents the rule. Hidden characters
// (Bidi_Control, Cf, Cc, Zl, Zp; and lone surrogates, which only JavaScript
// strings can hold) are shown as ⟨U+XXXX⟩; warnings name hidden characters
// and words that mix scripts (UTS 39's resolved script set), each at a JSON
// Pointer. The classes are the engine's own Unicode tables, through regular
// expression property escapes; src/render/cases.json holds the cases this
// file and the Rust side must both pass (tests/render.rs runs them here in
// Node.js). Pure functions, no DOM: dom.js's h() uses display() for every
// string the page shows.

const HIDDEN = /[\p{Bidi_Control}\p{Cf}\p{Cc}\p{Zl}\p{Zp}\p{Cs}]/u;
const HIDDEN_ALL = new RegExp(HIDDEN.source, 'gu');
const PRINTABLE_ASCII = /^[\x20-\x7e\n\t]*$/;
const WORD_CHAR = /[\p{L}\p{M}\p{N}\p{Pc}]/u;
/** Characters of every script (Common, Inherited): they mix with any. */
const ANY_SCRIPT = /[\p{scx=Zyyy}\p{scx=Zinh}]/u;

/** Most characters or words a warning lists. */
export const MAX_LISTED = 8;

/** The ISO 15924 codes of Unicode's scripts (Unicode 18; a code this
 *  engine's Unicode predates is skipped, and so are its characters, which
 *  the engine then does not know as letters either). Only the names are
 *  listed: which characters belong to a script is the engine's table.
 *  tests/render.rs checks this list against the scripts of the Rust crate
 *  and against every letter the engine knows. */
export const SCRIPTS = [
  'Adlm', 'Aghb', 'Ahom', 'Arab', 'Armi', 'Armn', 'Avst', 'Bali', 'Bamu', 'Bass', 'Batk', 'Beng',
  'Berf', 'Bhks', 'Bopo', 'Brah', 'Brai', 'Bugi', 'Buhd', 'Cakm', 'Cans', 'Cari', 'Cham', 'Cher',
  'Chrs', 'Copt', 'Cpmn', 'Cprt', 'Cyrl', 'Deva', 'Diak', 'Dogr', 'Dsrt', 'Dupl', 'Egyp', 'Elba',
  'Elym', 'Ethi', 'Gara', 'Geor', 'Glag', 'Gong', 'Gonm', 'Goth', 'Gran', 'Grek', 'Gujr', 'Gukh',
  'Guru', 'Hang', 'Hani', 'Hano', 'Hatr', 'Hebr', 'Hira', 'Hluw', 'Hmng', 'Hmnp', 'Hung', 'Ital',
  'Java', 'Jurc', 'Kali', 'Kana', 'Kawi', 'Khar', 'Khmr', 'Khoj', 'Kits', 'Knda', 'Krai', 'Kthi',
  'Lana', 'Laoo', 'Latn', 'Lepc', 'Limb', 'Lina', 'Linb', 'Lisu', 'Lyci', 'Lydi', 'Mahj', 'Maka',
  'Mand', 'Mani', 'Marc', 'Medf', 'Mend', 'Merc', 'Mero', 'Mlym', 'Modi', 'Mong', 'Mroo', 'Mtei',
  'Mult', 'Mymr', 'Nagm', 'Nand', 'Narb', 'Nbat', 'Newa', 'Nkoo', 'Nshu', 'Ogam', 'Olck', 'Onao',
  'Orkh', 'Orya', 'Osge', 'Osma', 'Ougr', 'Palm', 'Pauc', 'Pcun', 'Perm', 'Phag', 'Phli', 'Phlp',
  'Phnx', 'Plrd', 'Prti', 'Rjng', 'Rohg', 'Runr', 'Samr', 'Sarb', 'Saur', 'Seal', 'Sgnw', 'Shaw',
  'Shrd', 'Sidd', 'Sidt', 'Sind', 'Sinh', 'Sogd', 'Sogo', 'Sora', 'Soyo', 'Sund', 'Sunu', 'Sylo',
  'Syrc', 'Tagb', 'Takr', 'Tale', 'Talu', 'Taml', 'Tang', 'Tavt', 'Tayo', 'Telu', 'Tfng', 'Tglg',
  'Thaa', 'Thai', 'Tibt', 'Tirh', 'Tnsa', 'Todr', 'Tols', 'Toto', 'Tutg', 'Ugar', 'Vaii', 'Vith',
  'Wara', 'Wcho', 'Xpeo', 'Xsux', 'Yezi', 'Yiii', 'Zanb',
];

let scriptTests = null;

/** [code, RegExp] of every script this engine knows. */
function scriptTestsOf() {
  if (!scriptTests) {
    scriptTests = [];
    for (const code of SCRIPTS) {
      try {
        scriptTests.push([code, new RegExp(`\\p{scx=${code}}`, 'u')]);
      } catch { /* a script newer than this engine's Unicode */ }
    }
  }
  return scriptTests;
}

/** The scripts this engine knows, of SCRIPTS. */
export function knownScripts() {
  return scriptTestsOf().map(([code]) => code);
}

/** `U+202E`: how warnings name a character. */
export function codePoint(c) {
  return `U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}`;
}

/** Whether `c` (one code point) is hidden or changes direction. */
export function isHidden(c) {
  return HIDDEN.test(c);
}

/** `text` as a person is shown it: every hidden character as ⟨U+XXXX⟩;
 *  newlines and tabs stay where the surface shows several lines. */
export function display(text, multiline = true) {
  const s = String(text);
  if (!HIDDEN.test(s)) return s;
  return s.replace(HIDDEN_ALL, (c) => (multiline && (c === '\n' || c === '\t') ? c : `⟨${codePoint(c)}⟩`));
}

/** `value` as pretty JSON shown through the rule. */
export function displayJson(value) {
  const text = JSON.stringify(value, null, 2);
  return display(text === undefined ? String(value) : text, true);
}

/** `value` as pretty JSON that parses back to exactly `value`, every hidden
 *  character written as a JSON \uXXXX escape: for text a person edits. */
export function escapedJson(value) {
  const text = JSON.stringify(value, null, 2);
  if (text === undefined) return String(value);
  return text.replace(HIDDEN_ALL, (c) => (c === '\n' ? c
    : [...Array(c.length).keys()].map((i) => `\\u${c.charCodeAt(i).toString(16).padStart(4, '0')}`).join('')));
}

const scriptCache = new Map();

/** The augmented script set of a character (UTS 39), or null for one of
 *  every script. */
function scriptSet(c) {
  if (scriptCache.has(c)) return scriptCache.get(c);
  let set = null;
  if (!ANY_SCRIPT.test(c)) {
    set = new Set();
    for (const [code, re] of scriptTestsOf()) if (re.test(c)) set.add(code);
    if (set.has('Hani')) ['Hanb', 'Jpan', 'Kore'].forEach((s) => set.add(s));
    if (set.has('Hira') || set.has('Kana')) set.add('Jpan');
    if (set.has('Hang')) set.add('Kore');
    if (set.has('Bopo')) set.add('Hanb');
  }
  scriptCache.set(c, set);
  return set;
}

function isCjk(set) {
  return set.has('Hanb') || set.has('Jpan') || set.has('Kore');
}

/** The words of `text` that are not single-script. */
function mixedScriptWords(text) {
  const out = [];
  let word = '';
  let set = null; // null: every script so far
  let cjk = null;
  const flush = () => {
    if (word && set !== null && set.size === 0) out.push(word);
    word = '';
    set = null;
  };
  for (const c of text) {
    if (!WORD_CHAR.test(c)) {
      flush();
      cjk = null;
      continue;
    }
    const these = scriptSet(c);
    if (these !== null) {
      const thisCjk = isCjk(these);
      if (cjk !== null && cjk !== thisCjk) flush();
      cjk = thisCjk;
      set = set === null ? new Set(these) : new Set([...set].filter((s) => these.has(s)));
    }
    word += c;
  }
  flush();
  return out;
}

const HIDDEN_MESSAGE = 'contains hidden or direction-changing characters: ';
const MIXED_MESSAGE = 'mixes scripts within a word: ';

/** Collects the warnings of the fields of one object, one per (field, code),
 *  in the shape of the API's `warnings`. */
export class Warnings {
  constructor() {
    this.found = [];
  }

  entry(code, field) {
    let w = this.found.find((x) => x.code === code && x.field === field);
    if (!w) {
      w = { code, field, list: [] };
      this.found.push(w);
    }
    return w;
  }

  static add(list, item) {
    if (list.length < MAX_LISTED && !list.includes(item)) list.push(item);
  }

  /** Checks `text`, found at `field`. */
  text(field, text) {
    const s = String(text);
    if (PRINTABLE_ASCII.test(s)) return this;
    for (const c of s) {
      if (c !== '\n' && c !== '\t' && HIDDEN.test(c)) {
        Warnings.add(this.entry('hidden_characters', field).list, codePoint(c));
      }
    }
    for (const word of mixedScriptWords(s)) {
      Warnings.add(this.entry('mixed_script', field).list, word);
    }
    return this;
  }

  /** Checks every key and string of `value`, each at its own pointer below
   *  `field`. */
  json(field, value) {
    if (typeof value === 'string') {
      this.text(field, value);
    } else if (Array.isArray(value)) {
      value.forEach((item, i) => this.json(`${field}/${i}`, item));
    } else if (value && typeof value === 'object') {
      for (const [key, item] of Object.entries(value)) {
        const at = `${field}/${key.replace(/~/g, '~0').replace(/\//g, '~1')}`;
        this.text(at, key);
        this.json(at, item);
      }
    }
    return this;
  }

  /** The warnings found. */
  finish() {
    return this.found.map(({ code, field, list }) => (code === 'hidden_characters'
      ? { code, field, message: HIDDEN_MESSAGE + list.join(', '), chars: list }
      : { code, field, message: MIXED_MESSAGE + list.join(', '), words: list }));
  }
}

/** `field: message`, the line a surface shows for a warning. */
export function warningLine(warning) {
  return `${warning.field}: ${warning.message}`;
}
