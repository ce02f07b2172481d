//! The contract of the HTTP API: a response the tests receive must be one
//! the OpenAPI document (`overseer::http::openapi::document_json`, what
//! `GET /openapi.json` serves) describes for that route and status.
//!
//! [`check`] finds the operation whose path template matches the request
//! path, fails on a status the operation does not list, validates a JSON
//! body against the response's schema with `jsonschema` (the document's
//! components as the root, so `$ref`s resolve), and fails on any object
//! field the schema does not declare: utoipa's schemas allow extra fields,
//! so the validator alone would let an undocumented field through. A field
//! counts as declared when a branch the value matches (of `allOf`, `oneOf`,
//! `anyOf`) names it, or the object is a map (`additionalProperties` with a
//! schema) or free-form (no properties at all: metadata, tool arguments).
//!
//! [`super::answer`] (and [`super::send`] on it) calls it for every
//! request, so every test that talks to the API through the shared helpers
//! holds it to the document. It deliberately checks only JSON bodies: a
//! stream (`text/event-stream`), the metrics text and the page's files are
//! checked by status and media type only ([`check_media`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Map, Value};

/// The document, parsed once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        serde_json::from_str(overseer::http::openapi::document_json()).expect("the document")
    })
}

/// The path template of the document matching `path` (`/v1/sessions/{id}`
/// for `/v1/sessions/0193…`); a literal segment wins over a parameter.
pub fn template(path: &str) -> Option<String> {
    let doc = document();
    let segments: Vec<&str> = path.split('/').collect();
    let mut best: Option<(usize, &String)> = None;
    for template in doc["paths"].as_object()?.keys() {
        let parts: Vec<&str> = template.split('/').collect();
        if parts.len() != segments.len() {
            continue;
        }
        let mut literal = 0;
        let matches = parts.iter().zip(&segments).all(|(t, s)| {
            if t.starts_with('{') && t.ends_with('}') {
                !s.is_empty()
            } else {
                literal += 1;
                t == s
            }
        });
        if matches && best.is_none_or(|(n, _)| literal > n) {
            best = Some((literal, template));
        }
    }
    best.map(|(_, t)| t.clone())
}

/// Follows `$ref`s to what they name.
fn resolve(mut schema: &Value) -> &Value {
    let doc = document();
    for _ in 0..32 {
        let Some(r) = schema.get("$ref").and_then(Value::as_str) else {
            break;
        };
        let Some(pointer) = r.strip_prefix('#') else {
            break;
        };
        match doc.pointer(pointer) {
            Some(target) => schema = target,
            None => break,
        }
    }
    schema
}

/// `schema` as a standalone JSON Schema (2020-12) whose `#/components/…`
/// references resolve.
fn standalone(schema: &Value) -> Value {
    let mut root = match schema {
        Value::Object(m) => Value::Object(m.clone()),
        Value::Bool(b) => return Value::Bool(*b),
        _ => json!({}),
    };
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = document()["components"].clone();
    root
}

/// The compiled validator of `schema`, compiled once per schema: the
/// check runs on every answer of the suite.
fn validator(schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let key = schema.to_string();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(v) = cache.lock().unwrap().get(&key) {
        return Ok(v.clone());
    }
    let compiled = Arc::new(
        jsonschema::validator_for(&standalone(schema))
            .map_err(|e| format!("the document's schema does not compile: {e}"))?,
    );
    cache.lock().unwrap().insert(key, compiled.clone());
    Ok(compiled)
}

fn valid(schema: &Value, value: &Value) -> Result<(), String> {
    let validator = validator(schema)?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// What an object schema declares, over the branches `value` matches.
#[derive(Default)]
struct Declared<'a> {
    properties: Map<String, Value>,
    maps: Vec<&'a Value>,
    free: bool,
}

fn declared<'a>(schema: &'a Value, value: &Value, out: &mut Declared<'a>) {
    let schema = resolve(schema);
    let Some(obj) = schema.as_object() else {
        // `true` (or a non-object) allows anything.
        out.free = true;
        return;
    };
    let mut structured = false;
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        structured = true;
        for (k, v) in props {
            out.properties.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    match obj.get("additionalProperties") {
        Some(Value::Bool(false)) => structured = true,
        Some(Value::Bool(true)) => out.free = true,
        Some(s @ Value::Object(_)) => {
            structured = true;
            out.maps.push(s);
        }
        _ => {}
    }
    if let Some(all) = obj.get("allOf").and_then(Value::as_array) {
        structured = true;
        for branch in all {
            declared(branch, value, out);
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = obj.get(key).and_then(Value::as_array) {
            structured = true;
            for branch in branches {
                if valid(branch, value).is_ok() {
                    declared(branch, value, out);
                }
            }
        }
    }
    if !structured {
        out.free = true;
    }
}

/// Object fields of `value` (at `at`) that `schema` does not declare.
fn undeclared(schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let mut d = Declared::default();
            declared(schema, value, &mut d);
            for (k, v) in map {
                let here = format!("{at}/{k}");
                if let Some(s) = d.properties.get(k) {
                    undeclared(&s.clone(), v, &here, out);
                } else if let Some(s) = d.maps.first() {
                    undeclared(s, v, &here, out);
                } else if !d.free {
                    out.push(here);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = items_schema(schema, value) {
                for (n, item) in items.iter().enumerate() {
                    undeclared(&item_schema, item, &format!("{at}/{n}"), out);
                }
            }
        }
        _ => {}
    }
}

/// The `items` schema that applies to array `value` under `schema`.
fn items_schema(schema: &Value, value: &Value) -> Option<Value> {
    let schema = resolve(schema);
    if let Some(items) = schema.get("items") {
        return Some(items.clone());
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if valid(branch, value).is_ok() {
                if let Some(items) = items_schema(branch, value) {
                    return Some(items);
                }
            }
        }
    }
    None
}

/// Checks one response against the document: `Ok` when `method` `path`
/// may answer `status` with `body` (`Null`: no or a non-JSON body).
pub fn check(method: &str, path: &str, status: u16, body: &Value) -> Result<(), String> {
    let doc = document();
    let template =
        template(path).ok_or_else(|| format!("{method} {path}: no such path in the document"))?;
    let op = &doc["paths"][&template][method.to_ascii_lowercase()];
    if op.is_null() {
        // Another method on a documented path: the router's 405, in the
        // error shape (the document's info says so).
        if status != 405 {
            return Err(format!(
                "{method} {template}: no such operation in the document, yet it answered {status}: {body}"
            ));
        }
        return valid(&json!({"$ref": "#/components/schemas/ErrorBody"}), body)
            .map_err(|e| format!("{method} {template} 405: {e}"));
    }
    let Some(response) = op["responses"].get(status.to_string()) else {
        return Err(format!(
            "{method} {template} answered {status}, which the document does not list for it \
             (listed: {:?}); body: {body}",
            op["responses"]
                .as_object()
                .map(|m| m.keys().collect::<Vec<_>>())
        ));
    };
    let response = resolve(response);
    if body.is_null() {
        return Ok(());
    }
    let Some(schema) = response.pointer("/content/application~1json/schema") else {
        return Err(format!(
            "{method} {template} {status}: the document has no JSON body for it; got {body}"
        ));
    };
    valid(schema, body).map_err(|e| {
        format!(
            "{method} {template} {status}: the body does not match the document: {e}; body: {body}"
        )
    })?;
    let mut extra = Vec::new();
    undeclared(schema, body, "", &mut extra);
    if extra.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{method} {template} {status}: fields the document does not describe: {extra:?}; body: {body}"
        ))
    }
}

/// Checks a response whose body is not JSON (an event stream, the metrics
/// text, a page's file): `method` `path` may answer `status`, and with
/// `media_type` when the document names the media types of that answer.
pub fn check_media(method: &str, path: &str, status: u16, media_type: &str) -> Result<(), String> {
    check(method, path, status, &Value::Null)?;
    let doc = document();
    let template = template(path).unwrap_or_default();
    let op = &doc["paths"][&template][method.to_ascii_lowercase()];
    let Some(response) = op["responses"].get(status.to_string()) else {
        // The router's 405 on another method (`check` let it through).
        return Ok(());
    };
    match resolve(response).get("content").and_then(Value::as_object) {
        Some(content) if !content.contains_key(media_type) => Err(format!(
            "{method} {template} {status}: answered as {media_type:?}, which the document \
             does not list (listed: {:?})",
            content.keys().collect::<Vec<_>>()
        )),
        _ => Ok(()),
    }
}

/// [`check`], panicking with its message.
pub fn assert(method: &str, path: &str, status: u16, body: &Value) {
    if let Err(e) = check(method, path, status, body) {
        panic!("contract: {e}");
    }
}
