//! JSON Schemas that come from users (an `output_schema`, a tool's
//! `parameters` from the configuration, an MCP server or an editor): the
//! bounds they must keep, and the one way they are compiled.
//!
//! Compiling a schema and validating against it recurse once per level of
//! nesting and allocate per node and per regular expression, so what a
//! schema may cost is set by its shape: at most [`MAX_SCHEMA_DEPTH`] levels,
//! [`MAX_SCHEMA_BYTES`] as JSON and [`MAX_SCHEMA_PATTERNS`] regular
//! expressions, each compiled under [`MAX_PATTERN_BYTES`]; an
//! `output_schema`, which every checkpoint of its session writes, at most
//! [`MAX_OUTPUT_SCHEMA_BYTES`]. The bounds are
//! checked by an iterative walk before anything recursive touches the
//! schema, so a schema past them is refused without the stack or the heap
//! of the thread that checks it growing with it. Within them, compiling and
//! validating take at most a few hundred KiB of stack in a debug build
//! (measured: 8 KiB a level unoptimized) and memory proportional to the
//! bounds, freed with the validator.
//!
//! This module owns the bounds and compiling. It deliberately says nothing
//! about where a schema is used (the tool registry, the output check, the
//! edge's 400s and configuration errors name the field).

use serde_json::Value;

/// Levels of nesting (objects and arrays, the schema itself being the first)
/// a schema may have. `{"items": {"items": {"type": "string"}}}` has 3; an
/// object whose properties nest objects spends 2 levels per object
/// (`properties`, then the property's schema), so 32 levels hold 15 nested
/// objects, more than a model or a tool's arguments sensibly need.
pub const MAX_SCHEMA_DEPTH: usize = 32;

/// Bytes a schema may take as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// Bytes an `output_schema` may take as compact JSON. Smaller than a tool's:
/// it is part of the session's header, which every checkpoint writes and
/// every listing of sessions reads.
pub const MAX_OUTPUT_SCHEMA_BYTES: usize = 16 * 1024;

/// Regular expressions (`pattern` values and `patternProperties` keys) a
/// schema may hold: each is compiled into an automaton of its own.
pub const MAX_SCHEMA_PATTERNS: usize = 32;

/// What one regular expression may compile to (the `regex` crate's size
/// limit, for the program and for the lazy DFA built while matching), so a
/// short pattern such as `\w{1000}` cannot take megabytes.
pub const MAX_PATTERN_BYTES: usize = 256 * 1024;

/// How much of a JSON Pointer an error quotes (the keys are the user's).
const MAX_POINTER_CHARS: usize = 200;

/// Why a schema was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Neither an object nor a boolean.
    #[error("must be a JSON Schema (an object or a boolean)")]
    NotASchema,
    /// Nested past [`MAX_SCHEMA_DEPTH`].
    #[error("nested deeper than {limit} levels (at {at})")]
    TooDeep {
        /// The bound.
        limit: usize,
        /// JSON Pointer of the first value past it (cut short if long).
        at: String,
    },
    /// Longer than [`MAX_SCHEMA_BYTES`] as JSON (counting stops there).
    #[error("more than {limit} bytes as JSON")]
    TooLarge {
        /// The bound.
        limit: usize,
    },
    /// More regular expressions than [`MAX_SCHEMA_PATTERNS`].
    #[error("more than {limit} regular expressions (pattern, patternProperties)")]
    TooManyPatterns {
        /// The bound.
        limit: usize,
    },
    /// Within the bounds, but not a schema the validator compiles.
    #[error("not a valid JSON Schema: {0}")]
    Invalid(String),
}

/// Checks `schema` against the bounds, without recursion: the deepest
/// value, the JSON size and the regular expressions are found by one walk
/// with an explicit stack.
pub fn check_bounds(schema: &Value) -> Result<(), SchemaError> {
    check_bounds_of(schema, MAX_SCHEMA_BYTES)
}

/// [`check_bounds`] with a size bound of `max_bytes` (at most
/// [`MAX_SCHEMA_BYTES`]).
fn check_bounds_of(schema: &Value, max_bytes: usize) -> Result<(), SchemaError> {
    let max_bytes = max_bytes.min(MAX_SCHEMA_BYTES);
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(SchemaError::NotASchema);
    }
    check_depth_and_patterns(schema)?;
    // Serializing recurses, but only as deep as the walk above allowed.
    let mut counter = ByteCounter {
        bytes: 0,
        limit: max_bytes,
    };
    if serde_json::to_writer(&mut counter, schema).is_err() || counter.bytes > max_bytes {
        return Err(SchemaError::TooLarge { limit: max_bytes });
    }
    Ok(())
}

/// Compiles `schema` into a validator once it is within the bounds, with
/// regular expressions on the linear-time `regex` engine under
/// [`MAX_PATTERN_BYTES`].
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, SchemaError> {
    check_bounds(schema)?;
    jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::regex()
                .size_limit(MAX_PATTERN_BYTES)
                .dfa_size_limit(MAX_PATTERN_BYTES),
        )
        .build(schema)
        .map_err(|e| SchemaError::Invalid(e.to_string()))
}

/// Whether `schema` is within the bounds and compiles (the validator is
/// dropped at once).
pub fn check(schema: &Value) -> Result<(), SchemaError> {
    compile(schema).map(drop)
}

/// [`check`] for an `output_schema`, whose size bound is
/// [`MAX_OUTPUT_SCHEMA_BYTES`].
pub fn check_output(schema: &Value) -> Result<(), SchemaError> {
    check_bounds_of(schema, MAX_OUTPUT_SCHEMA_BYTES)?;
    check(schema)
}

fn check_depth_and_patterns(schema: &Value) -> Result<(), SchemaError> {
    // Depth-first with an explicit stack. A value at depth d is popped right
    // after the last value at depth d - 1 that was popped before it, which
    // is its parent, so `path[..d - 1]` is always the way to it.
    let mut path: Vec<String> = Vec::new();
    let mut stack: Vec<(&Value, usize, Option<String>)> = vec![(schema, 1, None)];
    let mut patterns = 0usize;
    while let Some((value, depth, segment)) = stack.pop() {
        path.truncate(depth.saturating_sub(2));
        if let Some(s) = segment {
            path.push(s);
        }
        match value {
            Value::Object(map) => {
                if depth > MAX_SCHEMA_DEPTH {
                    return Err(SchemaError::TooDeep {
                        limit: MAX_SCHEMA_DEPTH,
                        at: pointer(&path),
                    });
                }
                if map.get("pattern").is_some_and(Value::is_string) {
                    patterns += 1;
                }
                if let Some(Value::Object(by_pattern)) = map.get("patternProperties") {
                    patterns += by_pattern.len();
                }
                if patterns > MAX_SCHEMA_PATTERNS {
                    return Err(SchemaError::TooManyPatterns {
                        limit: MAX_SCHEMA_PATTERNS,
                    });
                }
                for (k, v) in map.iter().rev() {
                    stack.push((v, depth + 1, Some(k.clone())));
                }
            }
            Value::Array(items) => {
                if depth > MAX_SCHEMA_DEPTH {
                    return Err(SchemaError::TooDeep {
                        limit: MAX_SCHEMA_DEPTH,
                        at: pointer(&path),
                    });
                }
                for (i, v) in items.iter().enumerate().rev() {
                    stack.push((v, depth + 1, Some(i.to_string())));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// RFC 6901 pointer of `path`, cut to [`MAX_POINTER_CHARS`].
fn pointer(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        out.push('/');
        for c in segment.chars() {
            match c {
                '~' => out.push_str("~0"),
                '/' => out.push_str("~1"),
                c => out.push(c),
            }
        }
        if out.chars().count() > MAX_POINTER_CHARS {
            let mut cut: String = out.chars().take(MAX_POINTER_CHARS).collect();
            cut.push('…');
            return cut;
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Counts what is written, failing once past `limit` so a large schema is
/// not serialized in full to learn that it is too large.
struct ByteCounter {
    bytes: usize,
    limit: usize,
}

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes = self.bytes.saturating_add(buf.len());
        if self.bytes > self.limit {
            return Err(std::io::Error::other("over the limit"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn nested(key: &str, levels: usize) -> Value {
        let mut v = json!({"type": "string"});
        for _ in 1..levels {
            v = json!({ key: v });
        }
        v
    }

    #[test]
    fn depth_is_bounded_and_the_error_points_at_the_first_value_past_it() {
        assert_eq!(check(&nested("items", MAX_SCHEMA_DEPTH)), Ok(()));
        let err = check(&nested("items", MAX_SCHEMA_DEPTH + 1)).unwrap_err();
        let SchemaError::TooDeep { limit, at } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*limit, MAX_SCHEMA_DEPTH);
        assert_eq!(at, &"/items".repeat(MAX_SCHEMA_DEPTH));
        // Arrays count as levels too, and the pointer names indexes.
        let mut v = json!({"type": "null"});
        for _ in 1..=MAX_SCHEMA_DEPTH / 2 {
            v = json!({"anyOf": [{"type": "string"}, v]});
        }
        let err = check(&v).unwrap_err();
        assert!(
            matches!(&err, SchemaError::TooDeep { at, .. } if at.starts_with("/anyOf/1/anyOf/1/")),
            "{err:?}"
        );
        // Much deeper, under long keys: refused at the bound, the pointer
        // (the user's keys) cut short.
        let err = check(&nested(&"k".repeat(50), 1_000)).unwrap_err();
        assert!(
            matches!(&err, SchemaError::TooDeep { at, .. } if at.ends_with('…')),
            "{err:?}"
        );
    }

    #[test]
    fn size_and_patterns_are_bounded() {
        let wide: serde_json::Map<String, Value> = (0..4_000)
            .map(|i| (format!("property_{i}"), json!({"type": "string"})))
            .collect();
        let err = check(&json!({"type": "object", "properties": wide})).unwrap_err();
        assert_eq!(
            err,
            SchemaError::TooLarge {
                limit: MAX_SCHEMA_BYTES
            }
        );
        let props = |n: usize| -> serde_json::Map<String, Value> {
            (0..n)
                .map(|i| {
                    (
                        format!("p{i}"),
                        json!({"type": "string", "pattern": format!("^a{i}$")}),
                    )
                })
                .collect()
        };
        assert_eq!(
            check(&json!({"properties": props(MAX_SCHEMA_PATTERNS)})),
            Ok(())
        );
        assert_eq!(
            check(&json!({"properties": props(MAX_SCHEMA_PATTERNS + 1)})),
            Err(SchemaError::TooManyPatterns {
                limit: MAX_SCHEMA_PATTERNS
            })
        );
        // One pattern whose automaton would be larger than its share.
        let err = check(&json!({"pattern": "\\w{100000}"})).unwrap_err();
        assert!(matches!(err, SchemaError::Invalid(_)), "{err:?}");
        let mid: serde_json::Map<String, Value> =
            (0..3_000).map(|i| (format!("p{i}"), json!({}))).collect();
        let mid = json!({"properties": mid});
        assert_eq!(check(&mid), Ok(()));
        assert_eq!(
            check_output(&mid),
            Err(SchemaError::TooLarge {
                limit: MAX_OUTPUT_SCHEMA_BYTES
            })
        );
        assert_eq!(check(&json!("a string")), Err(SchemaError::NotASchema));
        assert_eq!(check(&json!(true)), Ok(()));
    }
}
