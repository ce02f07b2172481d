//! Structured output: checking a turn's final answer against the session's
//! `output_schema`, and the text of the one repair request a mismatch earns.
//!
//! Pure functions; when to check and what a mismatch does to the turn is the
//! machine's.

use serde_json::Value;

/// The answer as JSON, if it matches `schema`; otherwise what is wrong, in
/// words the model can act on. A JSON document wrapped in a Markdown code
/// fence is accepted (models often add one).
pub(crate) fn check(schema: &Value, answer: &str) -> Result<Value, String> {
    let text = strip_fence(answer.trim());
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("the answer is not a JSON document ({e})"))?;
    // Checked at creation; compiled again here under the same bounds, so
    // what a check costs never depends on where the schema came from.
    let validator = crate::schema::compile(schema)
        .map_err(|e| format!("the output schema itself is unusable: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .take(5)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(value)
    } else {
        Err(errors.join("; "))
    }
}

/// The message asking the model to answer again.
pub(crate) fn repair_request(problem: &str) -> String {
    format!(
        "Your last answer does not match the required JSON Schema: {problem}. \
         Reply again with only a JSON document that matches the schema, and nothing else."
    )
}

fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    // Drop an info string such as `json` on the opening line.
    let body = rest.split_once('\n').map_or(rest, |(_, b)| b);
    body.trim_end().strip_suffix("```").unwrap_or(body).trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    }

    #[test]
    fn a_matching_answer_parses_with_or_without_a_fence() {
        assert_eq!(check(&schema(), r#"{"n": 3}"#), Ok(json!({"n": 3})));
        assert_eq!(
            check(&schema(), "```json\n{\"n\": 4}\n```"),
            Ok(json!({"n": 4}))
        );
    }

    #[test]
    fn a_mismatch_says_what_is_wrong() {
        let e = check(&schema(), r#"{"n": "three"}"#).unwrap_err();
        assert!(e.contains("/n"), "{e}");
        let e = check(&schema(), "three").unwrap_err();
        assert!(e.contains("not a JSON document"), "{e}");
        let e = check(&schema(), "{}").unwrap_err();
        assert!(e.contains("\"n\""), "{e}");
    }
}
