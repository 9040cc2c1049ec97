//! The objects, the resourceVersion clock and the change history, and every verb's rules.
//! Everything here is synchronous and runs under one lock: a request sees and leaves a
//! consistent state, and each change gets the next resourceVersion.
//!
//! Long file: every verb's rules run under one lock on one state; split up, the lock discipline
//! would be spread over files.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::fields::{self, ListType, Scope, Writer};
use crate::patch::{self, PatchFailure};
use crate::resources::{ResourceType, StoreKey, Types, from_crd};
use crate::selectors::{FieldSelector, LabelSelector, labels_of};
use crate::status::{ApiError, FieldCause};

/// What happened to an object, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) key: StoreKey,
    pub(crate) namespace: String,
    pub(crate) kind: ChangeKind,
    pub(crate) object: Value,
    /// The object before this change, so a filtered watch can tell "left the selection".
    pub(crate) previous: Option<Value>,
}

/// The most the change history may hold, roughly, in bytes of JSON.
const HISTORY_BYTE_LIMIT: usize = 64 * 1024 * 1024;

impl Change {
    /// The JSON size of what the change keeps (the object and its previous state).
    fn approximate_size(&self) -> usize {
        let size = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
        size(&self.object) + self.previous.as_ref().map_or(0, size)
    }
}

/// Where a request points.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) rt: ResourceType,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

impl Target {
    fn ns(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
    fn is_status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
    fn not_found(&self) -> ApiError {
        ApiError::not_found(&self.rt.group, &self.rt.plural, self.name())
    }
}

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteOptions {
    pub(crate) manager: String,
    pub(crate) dry_run: bool,
    pub(crate) force: bool,
    /// `fieldValidation=Strict` for a JSON patch, whose unknown fields show only once applied.
    pub(crate) strict: bool,
}

/// Options of a list or watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOptions {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
}

/// Options of a delete, from the query and the `DeleteOptions` body.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub(crate) dry_run: bool,
    /// `propagationPolicy: Orphan`: dependents keep living, without this owner.
    pub(crate) orphan: bool,
    pub(crate) precondition_uid: Option<String>,
    pub(crate) precondition_rv: Option<String>,
}

/// The server's state.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) types: Types,
    rv: u64,
    objects: HashMap<StoreKey, BTreeMap<(String, String), Value>>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// The approximate bytes the history holds, and the most it may hold.
    history_bytes: usize,
    /// Changes up to and including this resourceVersion are no longer in the history.
    compacted_through: u64,
    changes: broadcast::Sender<Arc<Change>>,
    /// Owners removed whose dependents the garbage collector has still to look at. A worklist,
    /// so a long chain of owners does not become a deep recursion.
    gc_pending: Vec<String>,
    gc_running: bool,
}

/// The patch formats, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

pub(crate) fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let h = data_encoding::HEXLOWER.encode(&b);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// The five random characters the server appends to a `generateName`.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random::<u8>() as usize % ALPHABET.len()] as char)
        .collect()
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(part)
}

fn meta(object: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    object
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    object["metadata"].as_object_mut().expect("metadata is an object")
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    meta(object).get(field).and_then(Value::as_str)
}

fn finalizers(object: &Value) -> Vec<String> {
    meta(object)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The object without what the server owns, for "did anything change" and generation checks.
fn content(object: &Value, drop_status: bool) -> Value {
    let mut o = object.clone();
    if let Value::Object(m) = &mut o {
        m.remove("metadata");
        if drop_status {
            m.remove("status");
        }
    }
    o
}

/// Who owns what, without the timestamps every write refreshes.
fn ownership(object: &Value) -> Value {
    let mut entries = meta(object).get("managedFields").cloned().unwrap_or(json!([]));
    for e in entries.as_array_mut().into_iter().flatten() {
        if let Some(m) = e.as_object_mut() {
            m.remove("time");
        }
    }
    entries
}

fn without_volatile_metadata(object: &Value) -> Value {
    let mut o = object.clone();
    let m = meta_mut(&mut o);
    m.remove("resourceVersion");
    m.remove("managedFields");
    o
}

impl State {
    pub(crate) fn new(history_limit: usize) -> Self {
        let (changes, _) = broadcast::channel(4096);
        let mut state = Self {
            types: Types::with_builtins(),
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            history_bytes: 0,
            compacted_through: 0,
            changes,
            gc_pending: Vec::new(),
            gc_running: false,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            state.ensure_namespace(ns);
        }
        state
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Sets an object's `creationTimestamp` (a test control: the API never lets a client write
    /// it). False when there is no such object.
    pub(crate) fn backdate(&mut self, group: &str, plural: &str, namespace: &str, name: &str, at: &str) -> bool {
        // Through the served type, whose store may be another's (events.k8s.io Events).
        let Some(key) = self
            .types
            .all()
            .find(|t| t.group == group && t.plural == plural)
            .map(ResourceType::key)
        else {
            return false;
        };
        let Some(object) = self
            .objects
            .get_mut(&key)
            .and_then(|bucket| bucket.get_mut(&(namespace.to_owned(), name.to_owned())))
        else {
            return false;
        };
        meta_mut(object).insert("creationTimestamp".into(), json!(at));
        true
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Drops the whole change history, so a watch from any earlier resourceVersion gets 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.history_bytes = 0;
        self.compacted_through = self.rv;
    }

    pub(crate) fn ensure_namespace(&mut self, name: &str) {
        let rt = self.builtin("", "namespaces");
        let key = ("".to_string(), name.to_string());
        if self.objects.get(&rt.key()).is_some_and(|m| m.contains_key(&key)) {
            return;
        }
        let target = Target {
            rt,
            namespace: None,
            name: None,
            subresource: None,
        };
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        self.create(
            &target,
            body,
            &WriteOptions {
                manager: "kube-testserver".into(),
                ..Default::default()
            },
        )
        .expect("a namespace with a valid name can be created");
    }

    fn builtin(&self, group: &str, plural: &str) -> ResourceType {
        self.types
            .get(group, "v1", plural)
            .cloned()
            .expect("built-in kinds are always served")
    }

    fn bucket(&self, key: &StoreKey) -> Option<&BTreeMap<(String, String), Value>> {
        self.objects.get(key)
    }

    fn lookup(&self, t: &Target) -> Option<&Value> {
        self.bucket(&t.rt.key())?.get(&(t.ns(), t.name().to_string()))
    }

    /// The object as it is shown for the requested version.
    fn shown(rt: &ResourceType, object: &Value) -> Value {
        rt.show(object)
    }

    /// What is stored for an object written through `rt` (its apiVersion and kind checked).
    fn stored(rt: &ResourceType, written: Value) -> Value {
        let mut o = rt.view.store(&written);
        o["apiVersion"] = rt
            .view
            .stored_api_version()
            .map_or_else(|| written["apiVersion"].clone(), |v| json!(v));
        o["kind"] = written["kind"].clone();
        o
    }

    fn commit(&mut self, rt: &ResourceType, kind: ChangeKind, mut object: Value) -> Value {
        self.rv += 1;
        meta_mut(&mut object).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let ns = meta_str(&object, "namespace").unwrap_or_default().to_string();
        let name = meta_str(&object, "name").unwrap_or_default().to_string();
        let bucket = self.objects.entry(rt.key()).or_default();
        let previous = match kind {
            ChangeKind::Deleted => bucket.remove(&(ns.clone(), name)),
            _ => bucket.insert((ns.clone(), name), object.clone()),
        };
        let change = Arc::new(Change {
            rv: self.rv,
            key: rt.key(),
            namespace: ns,
            kind,
            object: object.clone(),
            previous,
        });
        self.history_bytes += change.approximate_size();
        self.history.push_back(change.clone());
        // Bounded by count and by size, as the real watch cache is bounded; the newest change
        // always stays.
        while self.history.len() > self.history_limit
            || (self.history_bytes > HISTORY_BYTE_LIMIT && self.history.len() > 1)
        {
            if let Some(old) = self.history.pop_front() {
                self.history_bytes -= old.approximate_size();
                self.compacted_through = old.rv;
            }
        }
        // Nobody listening is fine.
        let _ = self.changes.send(change);
        object
    }

    // ---- reads -----------------------------------------------------------------------------

    pub(crate) fn get(&self, t: &Target) -> Result<Value, ApiError> {
        self.lookup(t)
            .map(|o| Self::shown(&t.rt, o))
            .ok_or_else(|| t.not_found())
    }

    /// Objects in scope, sorted by namespace and name.
    fn matching<'a>(&'a self, t: &'a Target, opts: &'a ListOptions) -> impl Iterator<Item = &'a Value> + 'a {
        self.bucket(&t.rt.key())
            .into_iter()
            .flat_map(|b| b.iter())
            .filter(move |((ns, _), _)| t.namespace.as_ref().is_none_or(|want| want == ns))
            .map(|(_, o)| o)
            .filter(move |o| opts.labels.matches(&labels_of(o)) && opts.fields.matches(o))
    }

    pub(crate) fn list(&self, t: &Target, opts: &ListOptions) -> Result<Value, ApiError> {
        let start_after = match &opts.continue_token {
            Some(token) => Some(decode_continue(token)?),
            None => None,
        };
        let mut items: Vec<Value> = self
            .matching(t, opts)
            .filter(|o| {
                start_after.as_ref().is_none_or(|after| {
                    (
                        meta_str(o, "namespace").unwrap_or_default(),
                        meta_str(o, "name").unwrap_or_default(),
                    ) > (after.0.as_str(), after.1.as_str())
                })
            })
            .map(|o| Self::shown(&t.rt, o))
            .collect();
        let mut metadata = json!({"resourceVersion": self.rv.to_string()});
        if let Some(limit) = opts.limit.filter(|l| *l > 0 && items.len() > *l) {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let last = items.last().expect("limit is positive");
            let token = encode_continue(
                meta_str(last, "namespace").unwrap_or_default(),
                meta_str(last, "name").unwrap_or_default(),
            );
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(remaining);
        }
        Ok(json!({"kind": t.rt.list_kind, "apiVersion": t.rt.api_version(), "metadata": metadata, "items": items}))
    }

    /// The changes after `since` that a watch on `t` sees, or 410 when they are no longer kept.
    pub(crate) fn changes_since(&self, t: &Target, since: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        if since < self.compacted_through {
            return Err(ApiError::gone(format!(
                "too old resource version: {since} ({})",
                self.compacted_through + 1
            )));
        }
        Ok(self
            .history
            .iter()
            .filter(|c| c.rv > since && watches(t, c))
            .cloned()
            .collect())
    }

    /// The current objects in scope (as stored: the watch shows them), for the synthetic ADDED
    /// events a watch from "now" starts with.
    pub(crate) fn snapshot(&self, t: &Target, opts: &ListOptions) -> Vec<Value> {
        self.matching(t, opts).cloned().collect()
    }

    // ---- writes ----------------------------------------------------------------------------

    fn check_namespace_for_write(&self, t: &Target) -> Result<(), ApiError> {
        if !t.rt.namespaced {
            return Ok(());
        }
        let ns = t.ns();
        let key = self.builtin("", "namespaces").key();
        match self.bucket(&key).and_then(|b| b.get(&(String::new(), ns.clone()))) {
            None => Err(ApiError::not_found("", "namespaces", &ns)),
            Some(o) if meta(o).contains_key("deletionTimestamp") => Err(ApiError::forbidden(
                &t.rt.group,
                &t.rt.plural,
                t.name(),
                format!(
                    "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    t.rt.qualified(),
                    t.name()
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Checks the body's apiVersion and kind and fills them in when absent.
    fn check_type(t: &Target, body: &mut Value) -> Result<(), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: expected an object",
                t.rt.kind
            )));
        }
        let expected = t.rt.api_version();
        // Any served version of the group is accepted; the object is stored as the requested one.
        match body.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v != expected && !(t.rt.group.is_empty() && v == "v1") => {
                let group_of = |v: &str| v.rsplit_once('/').map_or(String::new(), |(g, _)| g.to_string());
                if group_of(v) != t.rt.group {
                    return Err(ApiError::bad_request(format!(
                        "the API version in the data ({v}) does not match the expected API version ({expected})"
                    )));
                }
            }
            _ => {}
        }
        match body.get("kind").and_then(Value::as_str) {
            Some(k) if k != t.rt.kind => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    t.rt.kind
                )));
            }
            _ => {}
        }
        body["apiVersion"] = json!(expected);
        body["kind"] = json!(t.rt.kind);
        Ok(())
    }

    fn check_namespace_in_body(t: &Target, body: &mut Value) -> Result<(), ApiError> {
        let ns = t.ns();
        let m = meta_mut(body);
        if t.rt.namespaced {
            match m.get("namespace").and_then(Value::as_str) {
                Some(given) if !given.is_empty() && given != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    m.insert("namespace".into(), json!(ns));
                }
            }
        } else {
            m.remove("namespace");
        }
        Ok(())
    }

    /// Kind-specific and schema-driven normalisation and validation of a candidate object.
    fn admit(&self, t: &Target, object: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        let name = meta_str(object, "name").unwrap_or_default().to_string();
        let mut causes = Vec::new();
        let name_ok = if t.rt.label_names {
            is_dns_label(&name)
        } else {
            is_dns_subdomain(&name)
        };
        if !name_ok {
            let rule = if t.rt.label_names {
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
            } else {
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            };
            causes.push(FieldCause::invalid("metadata.name", &json!(name), rule));
        }
        if t.rt.plural == "secrets" && t.rt.group.is_empty() {
            fold_string_data(object).map_err(|why| {
                ApiError::bad_request(format!("Secret in version \"v1\" cannot be handled as a Secret: {why}"))
            })?;
            // The API server's default for a Secret without a type.
            if object.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
                object["type"] = json!("Opaque");
            }
        }
        if let Some(schema) = &t.rt.schema {
            schema.normalise(object);
            causes.extend(schema.validate(object, old));
        }
        if t.rt.group == "apiextensions.k8s.io"
            && let Err(e) = from_crd(object)
        {
            causes.push(FieldCause::invalid("spec", &Value::Null, e.0));
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&t.rt.kind, &t.rt.group, &name, causes))
        }
    }

    pub(crate) fn create(&mut self, t: &Target, mut body: Value, opts: &WriteOptions) -> Result<Value, ApiError> {
        Self::check_type(t, &mut body)?;
        Self::check_namespace_in_body(t, &mut body)?;
        let mut body = Self::stored(&t.rt, body);
        let now = now();
        {
            let m = meta_mut(&mut body);
            if m.get("resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(ApiError::bad_request(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            let name = m.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            if name.is_empty() {
                match m.get("generateName").and_then(Value::as_str) {
                    Some(prefix) if !prefix.is_empty() => {
                        // The prefix is cut so that the name stays within 63 characters.
                        let prefix: String = prefix.chars().take(58).collect();
                        let generated = format!("{prefix}{}", name_suffix());
                        m.insert("name".into(), json!(generated));
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &t.rt.kind,
                            &t.rt.group,
                            "",
                            vec![FieldCause::required(
                                "metadata.name",
                                "name or generateName is required",
                            )],
                        ));
                    }
                }
            }
            for server_owned in [
                "uid",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "managedFields",
            ] {
                m.remove(server_owned);
            }
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(now));
            m.insert("generation".into(), json!(1));
        }
        if t.rt.status_subresource {
            body.as_object_mut().expect("checked above").remove("status");
        }
        if t.rt.plural == "namespaces" && t.rt.group.is_empty() {
            body["status"] = json!({"phase": "Active"});
        }
        if t.rt.group == "apiextensions.k8s.io" {
            body["status"] = crd_status(&body);
        }
        let name = meta_str(&body, "name").unwrap_or_default().to_string();
        let t = Target {
            name: Some(name.clone()),
            ..t.clone()
        };
        // Namespace lifecycle admission runs before validation, as on the real server.
        self.check_namespace_for_write(&t)?;
        self.admit(&t, &mut body, None)?;
        if self.lookup(&t).is_some() {
            return Err(ApiError::already_exists(&t.rt.group, &t.rt.plural, &name));
        }
        let lists = |p: &[String]| list_type(&t.rt, p);
        let who = writer(&t, opts, &now, &lists);
        fields::record_update(None, &mut body, &who);
        if opts.dry_run {
            return Ok(Self::shown(&t.rt, &body));
        }
        self.after_create(&t, &body)?;
        let created = self.commit(&t.rt, ChangeKind::Added, body);
        Ok(Self::shown(&t.rt, &created))
    }

    /// A created CRD starts serving its kind.
    fn after_create(&mut self, t: &Target, object: &Value) -> Result<(), ApiError> {
        if t.rt.group == "apiextensions.k8s.io" {
            let types = from_crd(object).map_err(|e| ApiError::bad_request(e.0))?;
            self.types
                .register_crd(meta_str(object, "name").unwrap_or_default(), types);
        }
        Ok(())
    }

    /// PUT: a whole new object (or a whole new status), with optimistic concurrency.
    pub(crate) fn update(&mut self, t: &Target, mut body: Value, opts: &WriteOptions) -> Result<Value, ApiError> {
        let old = self.lookup(t).cloned().ok_or_else(|| t.not_found())?;
        Self::check_type(t, &mut body)?;
        Self::check_namespace_in_body(t, &mut body)?;
        if meta_str(&body, "resourceVersion").is_none_or(str::is_empty) && !t.rt.allows_unconditional_update() {
            let cause = FieldCause {
                reason: "FieldValueInvalid",
                field: "metadata.resourceVersion".into(),
                detail: "Invalid value: 0x0: must be specified for an update".into(),
            };
            return Err(ApiError::invalid(&t.rt.kind, &t.rt.group, t.name(), vec![cause]));
        }
        let given = meta_str(&body, "name").unwrap_or_default();
        if given.is_empty() {
            meta_mut(&mut body).insert("name".into(), json!(t.name()));
        } else if given != t.name() {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({})",
                t.name()
            )));
        }
        let body = Self::stored(&t.rt, body);
        self.write(t, &old, body, opts, None)
    }

    /// The common end of update, patch and apply: server-owned fields kept, the status rule,
    /// finalizer rules, schema, generation, no-op detection and the final delete when the last
    /// finalizer goes.
    fn write(
        &mut self,
        t: &Target,
        old: &Value,
        mut new: Value,
        opts: &WriteOptions,
        applied: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let stale = match meta_str(&new, "resourceVersion") {
            Some(rv) if !rv.is_empty() => Some(rv) != meta_str(old, "resourceVersion"),
            _ => false,
        };
        if stale {
            return Err(ApiError::stale(&t.rt.group, &t.rt.plural, t.name()));
        }
        if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty())
            && Some(uid) != meta_str(old, "uid")
        {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(old, "uid").unwrap_or_default()
            );
            return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), &why));
        }
        let applied_ownership = applied.and(meta(&new).get("managedFields").cloned());
        if t.is_status() {
            // Only the status moves; everything else stays as stored.
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    new.as_object_mut()
                        .expect("stored objects are objects")
                        .remove("status");
                }
            }
        } else {
            for keep in [
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                let m = meta_mut(&mut new);
                match meta(old).get(keep) {
                    Some(v) => m.insert(keep.into(), v.clone()),
                    None => m.remove(keep),
                };
            }
            if t.rt.status_subresource {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        new.as_object_mut().expect("checked type").remove("status");
                    }
                }
            }
        }
        let owners = applied_ownership
            .or_else(|| meta(old).get("managedFields").cloned())
            .unwrap_or(json!([]));
        meta_mut(&mut new).insert("managedFields".into(), owners);
        let deleting = meta(old).contains_key("deletionTimestamp");
        if deleting {
            let before = finalizers(old);
            let added: Vec<String> = finalizers(&new).into_iter().filter(|f| !before.contains(f)).collect();
            if !added.is_empty() {
                let cause = FieldCause::forbidden(
                    "metadata.finalizers",
                    format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                );
                return Err(ApiError::invalid(&t.rt.kind, &t.rt.group, t.name(), vec![cause]));
            }
        }
        self.admit(t, &mut new, Some(old))?;
        let now = now();
        let lists = |p: &[String]| list_type(&t.rt, p);
        let who = writer(t, opts, &now, &lists);
        if applied.is_none() {
            fields::record_update(Some(old), &mut new, &who);
        }
        // Nothing changed (ownership aside from its timestamps): the real server writes nothing
        // and sends no event.
        if without_volatile_metadata(&new) == without_volatile_metadata(old) && ownership(&new) == ownership(old) {
            return Ok(Self::shown(&t.rt, old));
        }
        let spec_changed = content(&new, t.rt.status_subresource) != content(old, t.rt.status_subresource);
        if spec_changed {
            let generation = meta(old).get("generation").and_then(Value::as_i64).unwrap_or(1);
            meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
        }
        if opts.dry_run {
            return Ok(Self::shown(&t.rt, &new));
        }
        let is_namespace = t.rt.plural == "namespaces" && t.rt.group.is_empty();
        if deleting && finalizers(&new).is_empty() {
            if is_namespace {
                // A namespace goes only once it is also empty.
                let kept = self.commit(&t.rt, ChangeKind::Modified, new);
                let result = self.finish_namespace(t.name()).unwrap_or(kept);
                return Ok(Self::shown(&t.rt, &result));
            }
            let gone = self.commit(&t.rt, ChangeKind::Deleted, new);
            self.after_delete(&t.rt, &gone);
            return Ok(Self::shown(&t.rt, &gone));
        }
        if t.rt.group == "apiextensions.k8s.io" && !t.is_status() {
            // Names and versions may have changed: the status follows, keeping every version
            // ever stored.
            let mut status = crd_status(&new);
            let mut stored: Vec<Value> = old
                .pointer("/status/storedVersions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for v in status["storedVersions"].as_array().cloned().unwrap_or_default() {
                if !stored.contains(&v) {
                    stored.push(v);
                }
            }
            status["storedVersions"] = Value::Array(stored);
            if let Some(conditions) = old.pointer("/status/conditions") {
                status["conditions"] = conditions.clone();
            }
            new["status"] = status;
            self.after_create(t, &new)?;
        }
        Ok(Self::shown(&t.rt, &self.commit(&t.rt, ChangeKind::Modified, new)))
    }

    pub(crate) fn patch(
        &mut self,
        t: &Target,
        kind: PatchKind,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        if kind == PatchKind::Strategic && t.rt.custom {
            return Err(ApiError::unsupported_media_type(&[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ]));
        }
        let current = self.lookup(t).cloned();
        if kind == PatchKind::Apply {
            if current.is_none() && t.is_status() {
                return Err(t.not_found());
            }
            return self.apply(t, current, body, opts);
        }
        let current = current.ok_or_else(|| t.not_found())?;
        let mut patched = Self::shown(&t.rt, &current);
        match kind {
            PatchKind::Merge => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "error decoding patch: a merge patch must be a JSON object",
                    ));
                }
                patch::json_merge(&mut patched, &body);
            }
            PatchKind::Strategic => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "error decoding patch: a strategic merge patch must be a JSON object",
                    ));
                }
                patch::strategic_merge(&mut patched, &body);
            }
            PatchKind::Json => {
                match patch::json_patch(&mut patched, &body) {
                    Ok(()) => {}
                    Err(PatchFailure::Malformed(e)) => return Err(ApiError::bad_request(e)),
                    Err(PatchFailure::DoesNotApply(e)) => return Err(ApiError::patch_failed(e)),
                }
                if opts.strict
                    && let Some(schema) = &t.rt.schema
                {
                    let unknown = schema.unknown_fields(&patched);
                    if !unknown.is_empty() {
                        let listed: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                        return Err(ApiError::bad_request(format!(
                            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                            t.rt.kind,
                            t.rt.api_version(),
                            t.rt.kind,
                            listed.join(", ")
                        )));
                    }
                }
            }
            PatchKind::Apply => unreachable!("handled above"),
        }
        if !patched.is_object() {
            return Err(ApiError::patch_failed("the patched document is not an object"));
        }
        if meta_str(&patched, "name") != Some(t.name()) {
            let given = meta_str(&patched, "name").unwrap_or_default();
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({})",
                t.name()
            )));
        }
        Self::check_type(t, &mut patched)?;
        Self::check_namespace_in_body(t, &mut patched)?;
        let patched = Self::stored(&t.rt, patched);
        self.write(t, &current, patched, opts, None)
    }

    fn apply(
        &mut self,
        t: &Target,
        current: Option<Value>,
        mut body: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        if opts.manager.is_empty() {
            let cause = FieldCause::required("fieldManager", "is required for apply patch");
            return Err(ApiError::invalid("PatchOptions", "meta.k8s.io", "", vec![cause]));
        }
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "error decoding YAML: an apply configuration must be an object",
            ));
        }
        // An apply configuration names its type itself, and never carries managedFields.
        if body.get("apiVersion").and_then(Value::as_str).is_none_or(str::is_empty)
            || body.get("kind").and_then(Value::as_str).is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request(
                "invalid object type: apiVersion and kind must be set in an apply configuration",
            ));
        }
        if meta(&body).get("managedFields").is_some_and(|m| !m.is_null()) {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        Self::check_type(t, &mut body)?;
        Self::check_namespace_in_body(t, &mut body)?;
        // The name may be left out (it is taken from the URL), not changed.
        match meta_str(&body, "name") {
            None | Some("") => {
                meta_mut(&mut body).insert("name".into(), json!(t.name()));
            }
            Some(n) if n == t.name() => {}
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
        }
        let now = now();
        let lists = |p: &[String]| list_type(&t.rt, p);
        let who = writer(t, opts, &now, &lists);
        let shell = json!({"apiVersion": t.rt.api_version(), "kind": t.rt.kind,
            "metadata": {"name": t.name(), "namespace": t.namespace}});
        // Applied in the store's terms, as every other write records ownership: one set of
        // field names in managedFields, whichever API a manager writes through.
        let body = Self::stored(&t.rt, body);
        let base = current.clone().unwrap_or(shell);
        let merged = fields::apply(&base, &body, opts.force, &who).map_err(|conflicts| {
            let mut e = ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), "");
            e.message = fields::conflict_message(&conflicts);
            e.details["causes"] = Value::Array(
                conflicts
                    .iter()
                    .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.field}))
                    .collect(),
            );
            e
        })?;
        match current {
            Some(old) => {
                // Apply is not an optimistic write unless the configuration names a resourceVersion.
                let mut merged = merged;
                let wanted_rv = meta_str(&body, "resourceVersion").unwrap_or_default().to_string();
                meta_mut(&mut merged).insert("resourceVersion".into(), json!(wanted_rv));
                self.write(t, &old, merged, opts, Some(&body))
            }
            None => {
                let mut merged = merged;
                meta_mut(&mut merged).remove("resourceVersion");
                let fields = meta(&merged).get("managedFields").cloned();
                // create takes the object as the requested version shows it.
                let created = self.create(
                    t,
                    Self::shown(&t.rt, &merged),
                    &WriteOptions {
                        dry_run: true,
                        ..opts.clone()
                    },
                )?;
                let mut created = Self::stored(&t.rt, created);
                if let Some(f) = fields {
                    meta_mut(&mut created).insert("managedFields".into(), f);
                }
                if opts.dry_run {
                    return Ok(Self::shown(&t.rt, &created));
                }
                let t = Target {
                    name: Some(t.name().to_string()),
                    ..t.clone()
                };
                self.after_create(&t, &created)?;
                let created = self.commit(&t.rt, ChangeKind::Added, created);
                Ok(Self::shown(&t.rt, &created))
            }
        }
    }

    pub(crate) fn delete(&mut self, t: &Target, opts: &DeleteOptions) -> Result<Value, ApiError> {
        let current = self.lookup(t).cloned().ok_or_else(|| t.not_found())?;
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&current, "uid")
        {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(&current, "uid").unwrap_or_default()
            );
            return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), &why));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&current, "resourceVersion")
        {
            let why = format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta_str(&current, "resourceVersion").unwrap_or_default()
            );
            return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), &why));
        }
        let is_namespace = t.rt.plural == "namespaces" && t.rt.group.is_empty();
        if is_namespace && matches!(t.name(), "default" | "kube-system" | "kube-public") {
            return Err(ApiError::forbidden(
                "",
                "namespaces",
                t.name(),
                format!(
                    "namespaces \"{}\" is forbidden: this namespace may not be deleted",
                    t.name()
                ),
            ));
        }
        if !finalizers(&current).is_empty() || is_namespace {
            if meta(&current).contains_key("deletionTimestamp") {
                return Ok(Self::shown(&t.rt, &current));
            }
            let mut marked = current.clone();
            let generation = meta(&current).get("generation").and_then(Value::as_i64).unwrap_or(1);
            let m = meta_mut(&mut marked);
            m.insert("deletionTimestamp".into(), json!(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            m.insert("generation".into(), json!(generation + 1));
            if is_namespace {
                marked["status"] = json!({"phase": "Terminating"});
            }
            if opts.dry_run {
                return Ok(Self::shown(&t.rt, &marked));
            }
            let marked = self.commit(&t.rt, ChangeKind::Modified, marked);
            if is_namespace {
                self.empty_namespace(t.name());
                if let Some(finished) = self.finish_namespace(t.name()) {
                    return Ok(Self::shown(&t.rt, &finished));
                }
            }
            return Ok(Self::shown(&t.rt, &marked));
        }
        if opts.dry_run {
            return Ok(Self::shown(&t.rt, &current));
        }
        let gone = self.commit(&t.rt, ChangeKind::Deleted, current);
        if opts.orphan {
            self.orphan_dependents(meta_str(&gone, "uid").unwrap_or_default());
        }
        self.after_delete(&t.rt, &gone);
        if t.rt.returns_deleted_object {
            return Ok(Self::shown(&t.rt, &gone));
        }
        let mut details = json!({"name": t.name(), "kind": t.rt.plural, "uid": meta_str(&gone, "uid")});
        if !t.rt.group.is_empty() {
            details["group"] = json!(t.rt.group);
        }
        Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}))
    }

    pub(crate) fn delete_collection(
        &mut self,
        t: &Target,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let names: Vec<String> = self
            .matching(t, list)
            .map(|o| meta_str(o, "name").unwrap_or_default().to_string())
            .collect();
        let mut items = Vec::new();
        for name in names {
            let one = Target {
                name: Some(name),
                ..t.clone()
            };
            let before = self.lookup(&one).map(|o| Self::shown(&t.rt, o));
            match (self.delete(&one, opts), before) {
                // An object deleted at once answers with a Status; the list shows the object.
                (Ok(o), Some(before)) if o.get("kind").and_then(Value::as_str) == Some("Status") => items.push(before),
                (Ok(o), _) => items.push(o),
                (Err(_), _) => {}
            }
        }
        Ok(json!({"kind": t.rt.list_kind, "apiVersion": t.rt.api_version(),
            "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}))
    }

    /// What follows an object's final removal: a CRD takes its kind and objects with it, and
    /// a terminating namespace that is now empty goes.
    fn after_delete(&mut self, rt: &ResourceType, gone: &Value) {
        if rt.group == "apiextensions.k8s.io" {
            let name = meta_str(gone, "name").unwrap_or_default().to_string();
            if let Ok(types) = from_crd(gone)
                && let Some(first) = types.first()
            {
                let key = first.key();
                let objects: Vec<Value> = self
                    .objects
                    .get(&key)
                    .map(|b| b.values().cloned().collect())
                    .unwrap_or_default();
                for o in objects {
                    let gone = self.commit(first, ChangeKind::Deleted, o);
                    // Their dependents and a namespace waiting on them follow, as for any delete.
                    self.after_delete(first, &gone);
                }
            }
            self.types.unregister_crd(&name);
        }
        if rt.namespaced
            && let Some(ns) = meta_str(gone, "namespace")
        {
            let ns = ns.to_string();
            self.finish_namespace(&ns);
        }
        if let Some(uid) = meta_str(gone, "uid") {
            let uid = uid.to_string();
            self.gc_pending.push(uid);
            if !self.gc_running {
                self.gc_running = true;
                while let Some(owner) = self.gc_pending.pop() {
                    self.collect_dependents(&owner);
                }
                self.gc_running = false;
            }
        }
    }

    fn type_of(&self, key: &StoreKey) -> Option<ResourceType> {
        self.types.all().find(|t| t.key() == *key).cloned()
    }

    /// The garbage collector's background pass for one removed owner: each object that named it
    /// and has no other owner left is deleted (finalizers still hold it). Their own removal
    /// queues them as owners in turn, so chains of owners unwind.
    fn collect_dependents(&mut self, owner_uid: &str) {
        let refers_to = |o: &Value, uid: &str| {
            meta(o)
                .get("ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| refs.iter().any(|r| r.get("uid").and_then(Value::as_str) == Some(uid)))
        };
        let candidates: Vec<(StoreKey, String, String, Value)> = self
            .objects
            .iter()
            .flat_map(|(key, bucket)| bucket.iter().map(move |((ns, name), o)| (key, ns, name, o)))
            .filter(|(_, _, _, o)| refers_to(o, owner_uid) && !meta(o).contains_key("deletionTimestamp"))
            .map(|(key, ns, name, o)| (key.clone(), ns.clone(), name.clone(), o.clone()))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let live: std::collections::HashSet<String> = self
            .objects
            .values()
            .flat_map(|b| b.values())
            .filter_map(|o| meta_str(o, "uid").map(str::to_string))
            .collect();
        for (key, ns, name, o) in candidates {
            let owners = meta(&o)
                .get("ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let all_gone = owners.iter().all(|r| {
                r.get("uid")
                    .and_then(Value::as_str)
                    .is_none_or(|uid| !live.contains(uid))
            });
            let Some(rt) = self.type_of(&key) else { continue };
            if !all_gone {
                continue;
            }
            let namespace = rt.namespaced.then_some(ns);
            let t = Target {
                rt,
                namespace,
                name: Some(name),
                subresource: None,
            };
            if self.lookup(&t).is_some() {
                let _ = self.delete(&t, &DeleteOptions::default());
            }
        }
    }

    /// `Orphan` propagation: dependents lose their reference to the deleted owner.
    fn orphan_dependents(&mut self, owner_uid: &str) {
        let mut freed = Vec::new();
        for (key, bucket) in &self.objects {
            for o in bucket.values() {
                let refs = meta(o).get("ownerReferences").and_then(Value::as_array);
                if refs.is_some_and(|r| {
                    r.iter()
                        .any(|x| x.get("uid").and_then(Value::as_str) == Some(owner_uid))
                }) {
                    freed.push((key.clone(), o.clone()));
                }
            }
        }
        for (key, mut o) in freed {
            let Some(rt) = self.type_of(&key) else { continue };
            if let Some(Value::Array(refs)) = meta_mut(&mut o).get_mut("ownerReferences") {
                refs.retain(|x| x.get("uid").and_then(Value::as_str) != Some(owner_uid));
            }
            self.commit(&rt, ChangeKind::Modified, o);
        }
    }

    /// Deletes everything in a terminating namespace (objects with finalizers get marked).
    fn empty_namespace(&mut self, ns: &str) {
        let mut doomed = Vec::new();
        let mut kinds: Vec<&ResourceType> = self.types.all().filter(|rt| rt.namespaced).collect();
        // Several versions of one kind share one store: visit each store once.
        kinds.sort_by_key(|rt| rt.key());
        kinds.dedup_by_key(|rt| rt.key());
        for rt in kinds {
            if let Some(bucket) = self.objects.get(&rt.key()) {
                for ((obj_ns, name), _) in bucket.iter().filter(|((n, _), _)| n == ns) {
                    doomed.push(Target {
                        rt: rt.clone(),
                        namespace: Some(obj_ns.clone()),
                        name: Some(name.clone()),
                        subresource: None,
                    });
                }
            }
        }
        for t in doomed {
            if self.lookup(&t).is_some() {
                let _ = self.delete(&t, &DeleteOptions::default());
            }
        }
    }

    /// Removes a terminating namespace once nothing is left in it.
    fn finish_namespace(&mut self, ns: &str) -> Option<Value> {
        let rt = self.builtin("", "namespaces");
        let namespace = self.bucket(&rt.key())?.get(&(String::new(), ns.to_string()))?.clone();
        if !meta(&namespace).contains_key("deletionTimestamp") || !finalizers(&namespace).is_empty() {
            return None;
        }
        let occupied = self
            .objects
            .iter()
            .any(|(key, bucket)| key.plural != "namespaces" && bucket.keys().any(|(obj_ns, _)| obj_ns == ns));
        if occupied {
            return None;
        }
        Some(self.commit(&rt, ChangeKind::Deleted, namespace))
    }
}

/// A served CRD's status: names accepted, established, and its storage version recorded, so
/// clients waiting for `Established` go on.
fn crd_status(crd: &Value) -> Value {
    let now = now();
    let condition = |kind: &str, reason: &str, message: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": stored,
    })
}

/// The list type at a path of an object of this kind: the metadata rules, then the CRD schema,
/// then (for built-in kinds, which have no schema here) their well-known keyed lists.
fn list_type(rt: &ResourceType, path: &[String]) -> ListType {
    if let Some(t) = fields::metadata_list_type(path) {
        return t;
    }
    match &rt.schema {
        Some(schema) => schema.list_type(path).unwrap_or(ListType::Atomic),
        None => fields::builtin_list_type(path),
    }
}

/// Ownership rules for a write to `t`.
fn writer<'a>(
    t: &'a Target,
    opts: &'a WriteOptions,
    now: &'a str,
    lists: &'a dyn Fn(&[String]) -> ListType,
) -> Writer<'a> {
    let scope = match (t.is_status(), t.rt.status_subresource) {
        (true, _) => Scope::OnlyStatus,
        (false, true) => Scope::NotStatus,
        (false, false) => Scope::Everything,
    };
    Writer {
        manager: &opts.manager,
        subresource: if t.is_status() { "status" } else { "" },
        api_version: t.rt.api_version(),
        now,
        scope,
        lists,
    }
}

/// Whether a change belongs to a watch on `t`.
pub(crate) fn watches(t: &Target, change: &Change) -> bool {
    change.key == t.rt.key() && t.namespace.as_ref().is_none_or(|ns| *ns == change.namespace)
}

/// `stringData` is write-only: it is folded into `data` (base64) as the server does.
/// A value that is not a string is refused with the decoder's complaint.
fn fold_string_data(secret: &mut Value) -> Result<(), String> {
    let string_data = match secret.as_object_mut().and_then(|m| m.remove("stringData")) {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err("stringData: expected a map of strings".into()),
    };
    if !secret.get("data").is_some_and(Value::is_object) {
        secret["data"] = json!({});
    }
    for (k, v) in string_data {
        let Some(text) = v.as_str() else {
            return Err(format!("stringData.{k}: expected a string"));
        };
        secret["data"][k] = json!(data_encoding::BASE64.encode(text.as_bytes()));
    }
    Ok(())
}

fn encode_continue(ns: &str, name: &str) -> String {
    data_encoding::BASE64URL_NOPAD.encode(json!({"v": 1, "ns": ns, "name": name}).to_string().as_bytes())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let bad = || ApiError::bad_request("invalid continue token");
    let bytes = data_encoding::BASE64URL_NOPAD
        .decode(token.as_bytes())
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string).ok_or_else(bad);
    Ok((s("ns")?, s("name")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_look_like_uuids_and_differ() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn continue_tokens_round_trip_and_garbage_is_refused() {
        let t = encode_continue("ns", "a");
        assert_eq!(decode_continue(&t).unwrap(), ("ns".to_string(), "a".to_string()));
        assert_eq!(decode_continue("!!").unwrap_err().code, 400);
    }

    #[test]
    fn string_data_is_folded_into_data() {
        let mut s = json!({"data": {"a": "eA=="}, "stringData": {"b": "hi"}});
        fold_string_data(&mut s).unwrap();
        assert_eq!(s, json!({"data": {"a": "eA==", "b": "aGk="}}));
    }
}
