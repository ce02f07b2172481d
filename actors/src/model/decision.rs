//! Human decisions on tool calls.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ToolCallId;

/// One decision for one call, in its wire shape:
/// `{"decision": "approve"}`, `{"decision": "approve", "override_args": {…}}`,
/// `{"decision": "deny", "message": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
pub enum Decision {
    /// Run the call, optionally with some arguments replaced (shallow merge).
    Approve {
        /// Keys that replace the proposed arguments' keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        override_args: Option<Map<String, Value>>,
        /// Keys of the proposed arguments to drop (an optional argument the
        /// person removed); the result is validated like an override. A key
        /// named here must be among the proposed arguments and not in
        /// `override_args`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        remove_args: Vec<String>,
    },
    /// Do not run the call; the model sees `Tool denied by user: <message>`.
    Deny {
        /// Why, shown to the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
}

impl Decision {
    /// A plain approval.
    pub fn approve() -> Self {
        Self::Approve {
            override_args: None,
            remove_args: Vec::new(),
        }
    }

    /// Whether this approval changes the proposed arguments.
    pub fn edits(&self) -> bool {
        matches!(self, Self::Approve { override_args, remove_args } if override_args.is_some() || !remove_args.is_empty())
    }

    /// A denial with a reason.
    pub fn deny(message: impl Into<String>) -> Self {
        Self::Deny {
            message: Some(message.into()),
        }
    }
}

/// A batch of decisions, as submitted by one caller at one time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Submission {
    /// Call id → decision.
    pub decisions: BTreeMap<ToolCallId, Decision>,
    /// Call id → free-form object recorded with the decision. Every key must
    /// also be decided in this submission.
    #[serde(default)]
    pub metadata: BTreeMap<ToolCallId, Value>,
    /// Who decided (taken from the caller's token when authenticated).
    #[serde(default)]
    pub approved_by: Option<String>,
}

impl Submission {
    /// A submission of one decision.
    pub fn one(id: ToolCallId, decision: Decision) -> Self {
        let mut decisions = BTreeMap::new();
        decisions.insert(id, decision);
        Self {
            decisions,
            ..Self::default()
        }
    }
}

/// A decision as recorded on the call: who, when, metadata and, for an edit,
/// the argument diff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecisionRecord {
    /// The decision itself.
    pub decision: Decision,
    /// Who decided; `system` for timeouts and policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Wall-clock time the decision was accepted.
    pub at_ms: i64,
    /// Caller-supplied metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// For an override: `{key: {"from": old, "to": new}}` of the changed
    /// keys, and `{key: {"from": old, "removed": true}}` of removed ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_diff: Option<Value>,
}

/// Shallow-merges `overrides` into `original` (which should be an object),
/// drops the keys of `removals`, and returns the merged arguments and the
/// diff of changed and removed keys. A removal of a key the proposal lacks,
/// or of one `overrides` also sets, is refused with a sentence naming it.
/// Public so that a surface can show an edit's effect before it is
/// submitted.
pub fn merge_override(
    original: &Value,
    overrides: &Map<String, Value>,
    removals: &[String],
) -> Result<(Value, Value), String> {
    let mut merged = match original {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let mut diff = Map::new();
    for k in removals {
        if overrides.contains_key(k) {
            return Err(format!(
                "remove_args: '{k}' is also in override_args; a key is either replaced or removed"
            ));
        }
        let Some(old) = merged.remove(k) else {
            return Err(format!(
                "remove_args: '{k}' is not among the proposed arguments"
            ));
        };
        diff.insert(k.clone(), serde_json::json!({"from": old, "removed": true}));
    }
    for (k, v) in overrides {
        let old = merged.insert(k.clone(), v.clone());
        if old.as_ref() != Some(v) {
            diff.insert(
                k.clone(),
                serde_json::json!({"from": old.unwrap_or(Value::Null), "to": v}),
            );
        }
    }
    Ok((Value::Object(merged), Value::Object(diff)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_shapes_round_trip() {
        let d: Decision = serde_json::from_value(json!({"decision": "approve"})).unwrap();
        assert_eq!(d, Decision::approve());
        let d: Decision =
            serde_json::from_value(json!({"decision": "deny", "message": "no"})).unwrap();
        assert_eq!(d, Decision::deny("no"));
        let d: Decision = serde_json::from_value(
            json!({"decision": "approve", "override_args": {"path": "/tmp"}}),
        )
        .unwrap();
        assert!(matches!(
            d,
            Decision::Approve {
                override_args: Some(_),
                ..
            }
        ));
        assert!(serde_json::from_value::<Decision>(json!({"decision": "maybe"})).is_err());
    }

    #[test]
    fn merge_is_shallow_and_diffs_changed_keys() {
        let original = json!({"a": 1, "b": {"x": 1}});
        let overrides = json!({"b": {"y": 2}, "c": 3}).as_object().cloned().unwrap();
        let (merged, diff) = merge_override(&original, &overrides, &[]).unwrap();
        assert_eq!(merged, json!({"a": 1, "b": {"y": 2}, "c": 3}));
        assert_eq!(
            diff,
            json!({"b": {"from": {"x": 1}, "to": {"y": 2}}, "c": {"from": null, "to": 3}})
        );
    }

    #[test]
    fn removals_drop_proposed_keys_and_name_what_cannot_be_removed() {
        let original = json!({"a": 1, "b": 2});
        let none = Map::new();
        let (merged, diff) = merge_override(&original, &none, &["b".into()]).unwrap();
        assert_eq!(merged, json!({"a": 1}));
        assert_eq!(diff, json!({"b": {"from": 2, "removed": true}}));
        let err = merge_override(&original, &none, &["z".into()]).unwrap_err();
        assert!(
            err.contains("'z' is not among the proposed arguments"),
            "{err}"
        );
        let both = json!({"a": 5}).as_object().cloned().unwrap();
        let err = merge_override(&original, &both, &["a".into()]).unwrap_err();
        assert!(err.contains("'a' is also in override_args"), "{err}");
        // The wire shape: absent when empty, so existing records read back the same.
        let d: Decision =
            serde_json::from_value(json!({"decision": "approve", "remove_args": ["b"]})).unwrap();
        assert!(d.edits());
        assert_eq!(
            serde_json::to_value(Decision::approve()).unwrap(),
            json!({"decision": "approve"})
        );
    }
}
