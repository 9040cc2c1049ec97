use super::*;

fn lists(path: &[String]) -> ListType {
    metadata_list_type(path).unwrap_or_else(|| builtin_list_type(path))
}

fn who(manager: &str) -> Writer<'_> {
    Writer {
        manager,
        subresource: "",
        api_version: "v1".into(),
        now: "2026-01-01T00:00:00Z",
        scope: Scope::Everything,
        lists: &lists,
    }
}

#[test]
fn apply_conflicts_with_another_owner_unless_forced() {
    let mut obj = json!({"metadata": {"name": "a"}, "spec": {"port": 1}});
    record_update(None, &mut obj, &who("kubectl"));
    let err = apply(&obj, &json!({"spec": {"port": 2}}), false, &who("op")).unwrap_err();
    assert_eq!(
        conflict_message(&err),
        "Apply failed with 1 conflict: conflict with \"kubectl\" using v1: .spec.port"
    );
    // The same value is shared ownership, not a conflict.
    assert!(apply(&obj, &json!({"spec": {"port": 1}}), false, &who("op")).is_ok());
    let forced = apply(&obj, &json!({"spec": {"port": 2}}), true, &who("op")).unwrap();
    assert_eq!(forced["spec"]["port"], 2);
    let managers: Vec<&str> = forced["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, vec!["op"]);
}

#[test]
fn apply_removes_fields_the_manager_stops_applying() {
    let shell = json!({"metadata": {"name": "a"}});
    let first = apply(&shell, &json!({"spec": {"a": 1, "b": 2}}), false, &who("op")).unwrap();
    let second = apply(&first, &json!({"spec": {"a": 1}}), false, &who("op")).unwrap();
    assert_eq!(second["spec"], json!({"a": 1}));
}

#[test]
fn finalizers_are_a_set_two_managers_can_share() {
    let shell = json!({"metadata": {"name": "a"}});
    let one = apply(
        &shell,
        &json!({"metadata": {"finalizers": ["x/one"]}}),
        false,
        &who("a"),
    )
    .unwrap();
    let both = apply(&one, &json!({"metadata": {"finalizers": ["x/two"]}}), false, &who("b")).unwrap();
    assert_eq!(both["metadata"]["finalizers"], json!(["x/one", "x/two"]));
    // A manager dropping its own item leaves the other's.
    let left = apply(&both, &json!({"metadata": {"finalizers": []}}), false, &who("a")).unwrap();
    assert_eq!(left["metadata"]["finalizers"], json!(["x/two"]));
}

#[test]
fn map_lists_merge_and_conflict_per_item() {
    let shell = json!({"metadata": {"name": "a"}});
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let healthy = json!({"status": {"conditions": [{"type": "Healthy", "status": "False"}]}});
    let one = apply(&shell, &ready, false, &who("a")).unwrap();
    let both = apply(&one, &healthy, false, &who("b")).unwrap();
    assert_eq!(both["status"]["conditions"].as_array().unwrap().len(), 2);
    let clash = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let err = apply(&both, &clash, false, &who("b")).unwrap_err();
    assert_eq!(err[0].field, ".status.conditions[type=\"Ready\"].status");
    // Dropping an item removes it whole.
    let gone = apply(&both, &json!({"status": {"conditions": []}}), false, &who("b")).unwrap();
    assert_eq!(
        gone["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}])
    );
}

#[test]
fn status_scope_keeps_applies_apart() {
    let shell = json!({"metadata": {"name": "a"}, "spec": {"x": 1}});
    let mut main = who("op");
    main.scope = Scope::NotStatus;
    let applied = apply(
        &shell,
        &json!({"spec": {"x": 1}, "status": {"ready": true}}),
        false,
        &main,
    )
    .unwrap();
    assert!(
        applied.get("status").is_none(),
        "a main-resource apply does not write status"
    );
    let owned = from_fields_v1(&applied["metadata"]["managedFields"][0]["fieldsV1"]);
    assert!(owned.iter().all(|p| p[0] != "f:status"));
}

#[test]
fn untouched_entries_keep_their_time() {
    let mut obj = json!({"metadata": {"name": "a"}, "spec": {"a": 1}});
    let first = Writer {
        now: "2026-01-01T00:00:00Z",
        ..who("one")
    };
    record_update(None, &mut obj, &first);
    let old = obj.clone();
    let mut new = obj.clone();
    new["spec"]["b"] = json!(2);
    let second = Writer {
        now: "2026-02-02T00:00:00Z",
        ..who("two")
    };
    record_update(Some(&old), &mut new, &second);
    let times: Vec<(&str, &str)> = new["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["manager"].as_str().unwrap(), e["time"].as_str().unwrap()))
        .collect();
    assert_eq!(
        times,
        vec![("one", "2026-01-01T00:00:00Z"), ("two", "2026-02-02T00:00:00Z")]
    );
}

#[test]
fn fields_v1_round_trips() {
    let set: BTreeSet<FieldPath> = [
        vec!["f:spec".to_string(), "f:port".to_string()],
        vec!["f:metadata".into(), "f:finalizers".into(), "v:\"x\"".into()],
        vec![
            "f:status".into(),
            "f:conditions".into(),
            "k:{\"type\":\"Ready\"}".into(),
            "f:status".into(),
        ],
    ]
    .into();
    assert_eq!(from_fields_v1(&fields_v1(&set)), set);
}
