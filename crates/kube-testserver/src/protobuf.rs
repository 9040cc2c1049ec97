//! Request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which kubectl and client-go send for built-in kinds. The envelope is the magic `k8s\0`
//! followed by a `runtime.Unknown` naming the type and holding the object's own message; the
//! messages are decoded with `k8s-pb`'s types, and each kind's mapping to the JSON the store
//! keeps is written here, field by field.
//!
//! Covered: Secret, ConfigMap, Namespace, core `v1` Event and Pod (the kinds this server serves
//! that kubectl creates). Every field of the first four is mapped. A Pod's common fields are; a
//! Pod that sets one of the others (volumes, probes, security contexts, affinity, ...) is
//! refused with 415 naming the field, so nothing is ever dropped without a word: send it as
//! JSON. The destructuring below is exhaustive, so a field that a newer `k8s-pb` adds does not
//! compile until it is mapped or refused. Fields `k8s-pb` itself does not know (a client newer
//! than its Kubernetes version) are skipped by prost, the one gap.
//!
//! Long file: one mapping per built-in kind from its protobuf message to JSON, all of the same
//! shape; they are read and checked side by side.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;
use serde_json::{Map, Value, json};

use crate::resources::ResourceType;
use crate::status::ApiError;

/// The media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// What every protobuf-encoded object starts with.
const MAGIC: &[u8] = b"k8s\0";

/// A field this mapping does not carry: the request is refused rather than stored without it.
fn unsupported(kind: &str, field: &str) -> ApiError {
    ApiError::new(
        415,
        "UnsupportedMediaType",
        format!(
            "{kind} field {field} is not decoded from {MEDIA_TYPE} by this test server: send the object as application/json"
        ),
    )
}

fn malformed(kind: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!(
        "the object provided is unrecognized (must be of type {kind}): couldn't decode {MEDIA_TYPE}: {why}"
    ))
}

/// Whether bodies of `rt` are decoded from protobuf here.
pub(crate) fn supports(rt: &ResourceType) -> bool {
    rt.group.is_empty()
        && rt.version == "v1"
        && matches!(
            rt.plural.as_str(),
            "secrets" | "configmaps" | "namespaces" | "events" | "pods"
        )
}

/// The object in a protobuf request body for `rt`, as the JSON the store keeps.
pub(crate) fn decode(bytes: &[u8], rt: &ResourceType) -> Result<Value, ApiError> {
    let kind = rt.kind.as_str();
    if !supports(rt) {
        // As the real server answers for custom resources, which have no protobuf form.
        return Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
        ]));
    }
    let body = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| malformed(kind, "the body does not start with the k8s protobuf magic"))?;
    let envelope = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(body).map_err(|e| malformed(kind, e))?;
    if envelope.content_encoding.as_deref().is_some_and(|e| !e.is_empty()) {
        return Err(malformed(kind, "a content encoding is not supported"));
    }
    let type_meta = envelope.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let sent_kind = type_meta.kind.unwrap_or_default();
    let raw = envelope.raw.unwrap_or_default();
    let decoded = match (rt.group.as_str(), rt.version.as_str(), rt.plural.as_str()) {
        ("", "v1", "secrets") => secret(decode_message(&raw, kind)?),
        ("", "v1", "configmaps") => config_map(decode_message(&raw, kind)?),
        ("", "v1", "namespaces") => namespace(decode_message(&raw, kind)?),
        ("", "v1", "events") => event(decode_message(&raw, kind)?),
        ("", "v1", "pods") => pod(decode_message(&raw, kind)?)?,
        _ => unreachable!("supports() lists exactly these"),
    };
    // The envelope names the type as JSON's apiVersion and kind do; the store checks them.
    let mut object = decoded;
    if !api_version.is_empty() {
        object["apiVersion"] = json!(api_version);
    }
    if !sent_kind.is_empty() {
        object["kind"] = json!(sent_kind);
    }
    Ok(object)
}

/// The message in `raw`. NB: prost skips fields its type does not know (from a client newer
/// than `k8s-pb`'s Kubernetes version); they cannot be told from a re-encoding, which also drops
/// the empty map values client-go writes out, so they are not refused.
fn decode_message<M: Message + Default>(raw: &[u8], kind: &str) -> Result<M, ApiError> {
    M::decode(raw).map_err(|e| malformed(kind, e))
}

/// A JSON object built field by field, leaving out what the Go types' `omitempty` leaves out.
#[derive(Default)]
struct Fields(Map<String, Value>);

impl Fields {
    fn put(&mut self, key: &str, value: Value) -> &mut Self {
        self.0.insert(key.to_owned(), value);
        self
    }
    /// A string; empty reads as absent (gogo protobuf always sends Go's plain strings).
    fn text(&mut self, key: &str, value: Option<String>) -> &mut Self {
        match value.filter(|v| !v.is_empty()) {
            Some(v) => self.put(key, json!(v)),
            None => self,
        }
    }
    /// An optional number or bool (a Go pointer): kept whenever it was sent.
    fn some<T: Into<Value>>(&mut self, key: &str, value: Option<T>) -> &mut Self {
        match value {
            Some(v) => self.put(key, v.into()),
            None => self,
        }
    }
    /// A Go plain number with `omitempty`: zero reads as absent.
    fn nonzero<T: Into<Value> + Default + PartialEq>(&mut self, key: &str, value: Option<T>) -> &mut Self {
        match value.filter(|v| *v != T::default()) {
            Some(v) => self.put(key, v.into()),
            None => self,
        }
    }
    fn strings(&mut self, key: &str, value: Vec<String>) -> &mut Self {
        if value.is_empty() {
            self
        } else {
            self.put(key, json!(value))
        }
    }
    fn string_map(&mut self, key: &str, value: BTreeMap<String, String>) -> &mut Self {
        if value.is_empty() {
            self
        } else {
            self.put(key, json!(value))
        }
    }
    fn bytes_map(&mut self, key: &str, value: BTreeMap<String, Vec<u8>>) -> &mut Self {
        if value.is_empty() {
            return self;
        }
        let encoded: Map<String, Value> = value
            .into_iter()
            .map(|(k, v)| (k, json!(data_encoding::BASE64.encode(&v))))
            .collect();
        self.put(key, Value::Object(encoded))
    }
    fn object(&mut self, key: &str, value: Option<Value>) -> &mut Self {
        match value {
            Some(v) if v.as_object().is_some_and(|m| !m.is_empty()) => self.put(key, v),
            _ => self,
        }
    }
    fn list(&mut self, key: &str, value: Vec<Value>) -> &mut Self {
        if value.is_empty() {
            self
        } else {
            self.put(key, Value::Array(value))
        }
    }
    fn done(&mut self) -> Value {
        Value::Object(std::mem::take(&mut self.0))
    }
}

/// Go's zero `time.Time` as protobuf seconds (0001-01-01T00:00:00Z).
const ZERO_TIME_SECONDS: i64 = -62_135_596_800;

fn seconds_text(seconds: Option<i64>, nanos: Option<i32>, micros: bool) -> Option<String> {
    let s = seconds.unwrap_or(0);
    let n = nanos.unwrap_or(0);
    if (s == 0 && n == 0) || s == ZERO_TIME_SECONDS {
        return None;
    }
    let at = jiff::Timestamp::from_second(s).ok()?;
    let base = at.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    Some(if micros {
        format!("{base}.{:06}Z", n.max(0) / 1000)
    } else {
        format!("{base}Z")
    })
}

fn time(t: Option<meta::Time>) -> Option<String> {
    t.and_then(|t| seconds_text(t.seconds, t.nanos, false))
}

fn micro_time(t: Option<meta::MicroTime>) -> Option<String> {
    t.and_then(|t| seconds_text(t.seconds, t.nanos, true))
}

fn object_meta(m: Option<meta::ObjectMeta>) -> Value {
    let meta::ObjectMeta {
        name,
        generate_name,
        namespace,
        self_link,
        uid,
        resource_version,
        generation,
        creation_timestamp,
        deletion_timestamp,
        deletion_grace_period_seconds,
        labels,
        annotations,
        owner_references,
        finalizers,
        managed_fields,
    } = m.unwrap_or_default();
    let owners = owner_references
        .into_iter()
        .map(|r| {
            let meta::OwnerReference {
                api_version,
                kind,
                name,
                uid,
                controller,
                block_owner_deletion,
            } = r;
            Fields::default()
                .text("apiVersion", api_version)
                .text("kind", kind)
                .text("name", name)
                .text("uid", uid)
                .some("controller", controller)
                .some("blockOwnerDeletion", block_owner_deletion)
                .done()
        })
        .collect();
    let managed = managed_fields
        .into_iter()
        .map(|f| {
            let meta::ManagedFieldsEntry {
                manager,
                operation,
                api_version,
                time: at,
                fields_type,
                fields_v1,
                subresource,
            } = f;
            let fields = fields_v1
                .and_then(|f| f.raw)
                .and_then(|raw| serde_json::from_slice::<Value>(&raw).ok());
            Fields::default()
                .text("manager", manager)
                .text("operation", operation)
                .text("apiVersion", api_version)
                .text("time", time(at))
                .text("fieldsType", fields_type)
                .object("fieldsV1", fields)
                .text("subresource", subresource)
                .done()
        })
        .collect();
    Fields::default()
        .text("name", name)
        .text("generateName", generate_name)
        .text("namespace", namespace)
        .text("selfLink", self_link)
        .text("uid", uid)
        .text("resourceVersion", resource_version)
        .nonzero("generation", generation)
        .text("creationTimestamp", time(creation_timestamp))
        .text("deletionTimestamp", time(deletion_timestamp))
        .some("deletionGracePeriodSeconds", deletion_grace_period_seconds)
        .string_map("labels", labels)
        .string_map("annotations", annotations)
        .list("ownerReferences", owners)
        .strings("finalizers", finalizers)
        .list("managedFields", managed)
        .done()
}

fn secret(s: core::Secret) -> Value {
    let core::Secret {
        metadata,
        immutable,
        data,
        string_data,
        r#type,
    } = s;
    Fields::default()
        .put("metadata", object_meta(metadata))
        .some("immutable", immutable)
        .bytes_map("data", data)
        .string_map("stringData", string_data)
        .text("type", r#type)
        .done()
}

fn config_map(c: core::ConfigMap) -> Value {
    let core::ConfigMap {
        metadata,
        immutable,
        data,
        binary_data,
    } = c;
    Fields::default()
        .put("metadata", object_meta(metadata))
        .some("immutable", immutable)
        .string_map("data", data)
        .bytes_map("binaryData", binary_data)
        .done()
}

fn namespace(n: core::Namespace) -> Value {
    let core::Namespace { metadata, spec, status } = n;
    let spec = spec.map(|s| {
        let core::NamespaceSpec { finalizers } = s;
        Fields::default().strings("finalizers", finalizers).done()
    });
    let status = status.map(|s| {
        let core::NamespaceStatus { phase, conditions } = s;
        let conditions = conditions
            .into_iter()
            .map(|c| {
                let core::NamespaceCondition {
                    r#type,
                    status,
                    last_transition_time,
                    reason,
                    message,
                } = c;
                Fields::default()
                    .text("type", r#type)
                    .text("status", status)
                    .text("lastTransitionTime", time(last_transition_time))
                    .text("reason", reason)
                    .text("message", message)
                    .done()
            })
            .collect();
        Fields::default()
            .text("phase", phase)
            .list("conditions", conditions)
            .done()
    });
    Fields::default()
        .put("metadata", object_meta(metadata))
        .object("spec", spec)
        .object("status", status)
        .done()
}

fn object_reference(r: Option<core::ObjectReference>) -> Option<Value> {
    r.map(|r| {
        let core::ObjectReference {
            kind,
            namespace,
            name,
            uid,
            api_version,
            resource_version,
            field_path,
        } = r;
        Fields::default()
            .text("kind", kind)
            .text("namespace", namespace)
            .text("name", name)
            .text("uid", uid)
            .text("apiVersion", api_version)
            .text("resourceVersion", resource_version)
            .text("fieldPath", field_path)
            .done()
    })
}

fn event(e: core::Event) -> Value {
    let core::Event {
        metadata,
        involved_object,
        reason,
        message,
        source,
        first_timestamp,
        last_timestamp,
        count,
        r#type,
        event_time,
        series,
        action,
        related,
        reporting_component,
        reporting_instance,
    } = e;
    let source = source.map(|s| {
        let core::EventSource { component, host } = s;
        Fields::default().text("component", component).text("host", host).done()
    });
    let series = series.map(|s| {
        let core::EventSeries {
            count,
            last_observed_time,
        } = s;
        Fields::default()
            .nonzero("count", count)
            .text("lastObservedTime", micro_time(last_observed_time))
            .done()
    });
    // involvedObject is not omitempty in the Go type: an Event always shows one.
    Fields::default()
        .put("metadata", object_meta(metadata))
        .put("involvedObject", object_reference(involved_object).unwrap_or(json!({})))
        .text("reason", reason)
        .text("message", message)
        .object("source", source)
        .text("firstTimestamp", time(first_timestamp))
        .text("lastTimestamp", time(last_timestamp))
        .nonzero("count", count)
        .text("type", r#type)
        .text("eventTime", micro_time(event_time))
        .object("series", series)
        .text("action", action)
        .object("related", object_reference(related))
        .text("reportingComponent", reporting_component)
        .text("reportingInstance", reporting_instance)
        .done()
}

/// Refuses `field` of `kind` when it carries anything.
fn refuse_if(set: bool, kind: &str, field: &str) -> Result<(), ApiError> {
    if set { Err(unsupported(kind, field)) } else { Ok(()) }
}

fn quantities(q: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>) -> BTreeMap<String, String> {
    q.into_iter().map(|(k, v)| (k, v.string.unwrap_or_default())).collect()
}

fn container(c: core::Container, at: &str) -> Result<Value, ApiError> {
    let core::Container {
        name,
        image,
        command,
        args,
        working_dir,
        ports,
        env_from,
        env,
        resources,
        resize_policy,
        restart_policy,
        restart_policy_rules,
        volume_mounts,
        volume_devices,
        liveness_probe,
        readiness_probe,
        startup_probe,
        lifecycle,
        termination_message_path,
        termination_message_policy,
        image_pull_policy,
        security_context,
        stdin,
        stdin_once,
        tty,
    } = c;
    let field = |f: &str| format!("{at}.{f}");
    refuse_if(!env_from.is_empty(), "Pod", &field("envFrom"))?;
    refuse_if(!resize_policy.is_empty(), "Pod", &field("resizePolicy"))?;
    refuse_if(!restart_policy_rules.is_empty(), "Pod", &field("restartPolicyRules"))?;
    refuse_if(!volume_devices.is_empty(), "Pod", &field("volumeDevices"))?;
    refuse_if(liveness_probe.is_some(), "Pod", &field("livenessProbe"))?;
    refuse_if(readiness_probe.is_some(), "Pod", &field("readinessProbe"))?;
    refuse_if(startup_probe.is_some(), "Pod", &field("startupProbe"))?;
    refuse_if(lifecycle.is_some(), "Pod", &field("lifecycle"))?;
    refuse_if(security_context.is_some(), "Pod", &field("securityContext"))?;
    let ports = ports
        .into_iter()
        .map(|p| {
            let core::ContainerPort {
                name,
                host_port,
                container_port,
                protocol,
                host_ip,
            } = p;
            Fields::default()
                .text("name", name)
                .nonzero("hostPort", host_port)
                .some("containerPort", container_port)
                .text("protocol", protocol)
                .text("hostIP", host_ip)
                .done()
        })
        .collect();
    let mut vars = Vec::new();
    for (i, v) in env.into_iter().enumerate() {
        let core::EnvVar {
            name,
            value,
            value_from,
        } = v;
        refuse_if(value_from.is_some(), "Pod", &field(&format!("env[{i}].valueFrom")))?;
        vars.push(Fields::default().text("name", name).text("value", value).done());
    }
    let resources = match resources {
        None => None,
        Some(r) => {
            let core::ResourceRequirements {
                limits,
                requests,
                claims,
            } = r;
            refuse_if(!claims.is_empty(), "Pod", &field("resources.claims"))?;
            // Not omitempty in the Go type: a container shows `resources: {}`.
            Some(
                Fields::default()
                    .string_map("limits", quantities(limits))
                    .string_map("requests", quantities(requests))
                    .done(),
            )
        }
    };
    let mounts = volume_mounts
        .into_iter()
        .map(|m| {
            let core::VolumeMount {
                name,
                read_only,
                recursive_read_only,
                mount_path,
                sub_path,
                mount_propagation,
                sub_path_expr,
            } = m;
            Fields::default()
                .text("name", name)
                .nonzero("readOnly", read_only)
                .text("recursiveReadOnly", recursive_read_only)
                .text("mountPath", mount_path)
                .text("subPath", sub_path)
                .text("mountPropagation", mount_propagation)
                .text("subPathExpr", sub_path_expr)
                .done()
        })
        .collect();
    let mut out = Fields::default();
    out.text("name", name)
        .text("image", image)
        .strings("command", command)
        .strings("args", args)
        .text("workingDir", working_dir)
        .list("ports", ports)
        .list("env", vars);
    if let Some(r) = resources {
        out.put("resources", r);
    }
    Ok(out
        .text("restartPolicy", restart_policy)
        .list("volumeMounts", mounts)
        .text("terminationMessagePath", termination_message_path)
        .text("terminationMessagePolicy", termination_message_policy)
        .text("imagePullPolicy", image_pull_policy)
        .nonzero("stdin", stdin)
        .nonzero("stdinOnce", stdin_once)
        .nonzero("tty", tty)
        .done())
}

fn pod_spec(s: core::PodSpec) -> Result<Value, ApiError> {
    let core::PodSpec {
        volumes,
        init_containers,
        containers,
        ephemeral_containers,
        restart_policy,
        termination_grace_period_seconds,
        active_deadline_seconds,
        dns_policy,
        node_selector,
        service_account_name,
        service_account,
        automount_service_account_token,
        node_name,
        host_network,
        host_pid,
        host_ipc,
        share_process_namespace,
        security_context,
        image_pull_secrets,
        hostname,
        subdomain,
        affinity,
        scheduler_name,
        tolerations,
        host_aliases,
        priority_class_name,
        priority,
        dns_config,
        readiness_gates,
        runtime_class_name,
        enable_service_links,
        preemption_policy,
        overhead,
        topology_spread_constraints,
        set_hostname_as_fqdn,
        os,
        host_users,
        scheduling_gates,
        resource_claims,
        resources,
        hostname_override,
        workload_ref,
    } = s;
    for (set, field) in [
        (!volumes.is_empty(), "spec.volumes"),
        (!ephemeral_containers.is_empty(), "spec.ephemeralContainers"),
        (security_context.is_some(), "spec.securityContext"),
        (affinity.is_some(), "spec.affinity"),
        (!tolerations.is_empty(), "spec.tolerations"),
        (!host_aliases.is_empty(), "spec.hostAliases"),
        (dns_config.is_some(), "spec.dnsConfig"),
        (!readiness_gates.is_empty(), "spec.readinessGates"),
        (!overhead.is_empty(), "spec.overhead"),
        (
            !topology_spread_constraints.is_empty(),
            "spec.topologySpreadConstraints",
        ),
        (os.is_some(), "spec.os"),
        (!scheduling_gates.is_empty(), "spec.schedulingGates"),
        (!resource_claims.is_empty(), "spec.resourceClaims"),
        (resources.is_some(), "spec.resources"),
        (workload_ref.is_some(), "spec.workloadRef"),
    ] {
        refuse_if(set, "Pod", field)?;
    }
    let containers = containers
        .into_iter()
        .enumerate()
        .map(|(i, c)| container(c, &format!("spec.containers[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let init_containers = init_containers
        .into_iter()
        .enumerate()
        .map(|(i, c)| container(c, &format!("spec.initContainers[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let pull_secrets = image_pull_secrets
        .into_iter()
        .map(|r| Fields::default().text("name", r.name).done())
        .collect();
    Ok(Fields::default()
        .list("initContainers", init_containers)
        .put("containers", Value::Array(containers))
        .text("restartPolicy", restart_policy)
        .some("terminationGracePeriodSeconds", termination_grace_period_seconds)
        .some("activeDeadlineSeconds", active_deadline_seconds)
        .text("dnsPolicy", dns_policy)
        .string_map("nodeSelector", node_selector)
        .text("serviceAccountName", service_account_name)
        .text("serviceAccount", service_account)
        .some("automountServiceAccountToken", automount_service_account_token)
        .text("nodeName", node_name)
        .nonzero("hostNetwork", host_network)
        .nonzero("hostPID", host_pid)
        .nonzero("hostIPC", host_ipc)
        .some("shareProcessNamespace", share_process_namespace)
        .list("imagePullSecrets", pull_secrets)
        .text("hostname", hostname)
        .text("subdomain", subdomain)
        .text("schedulerName", scheduler_name)
        .text("priorityClassName", priority_class_name)
        .some("priority", priority)
        .text("runtimeClassName", runtime_class_name)
        .some("enableServiceLinks", enable_service_links)
        .text("preemptionPolicy", preemption_policy)
        .some("setHostnameAsFQDN", set_hostname_as_fqdn)
        .some("hostUsers", host_users)
        .text("hostnameOverride", hostname_override)
        .done())
}

fn pod_status(s: core::PodStatus) -> Result<Value, ApiError> {
    let core::PodStatus {
        observed_generation,
        phase,
        conditions,
        message,
        reason,
        nominated_node_name,
        host_ip,
        host_ips,
        pod_ip,
        pod_ips,
        start_time,
        init_container_statuses,
        container_statuses,
        qos_class,
        ephemeral_container_statuses,
        resize,
        resource_claim_statuses,
        extended_resource_claim_status,
        allocated_resources,
        resources,
    } = s;
    for (set, field) in [
        (!conditions.is_empty(), "status.conditions"),
        (!init_container_statuses.is_empty(), "status.initContainerStatuses"),
        (!container_statuses.is_empty(), "status.containerStatuses"),
        (
            !ephemeral_container_statuses.is_empty(),
            "status.ephemeralContainerStatuses",
        ),
        (!resource_claim_statuses.is_empty(), "status.resourceClaimStatuses"),
        (
            extended_resource_claim_status.is_some(),
            "status.extendedResourceClaimStatus",
        ),
        (!allocated_resources.is_empty(), "status.allocatedResources"),
        (resources.is_some(), "status.resources"),
    ] {
        refuse_if(set, "Pod", field)?;
    }
    let ips = |ips: Vec<Option<String>>| -> Vec<Value> {
        ips.into_iter()
            .map(|ip| Fields::default().text("ip", ip).done())
            .collect()
    };
    Ok(Fields::default()
        .nonzero("observedGeneration", observed_generation)
        .text("phase", phase)
        .text("message", message)
        .text("reason", reason)
        .text("nominatedNodeName", nominated_node_name)
        .text("hostIP", host_ip)
        .list("hostIPs", ips(host_ips.into_iter().map(|i| i.ip).collect()))
        .text("podIP", pod_ip)
        .list("podIPs", ips(pod_ips.into_iter().map(|i| i.ip).collect()))
        .text("startTime", time(start_time))
        .text("qosClass", qos_class)
        .text("resize", resize)
        .done())
}

fn pod(p: core::Pod) -> Result<Value, ApiError> {
    let core::Pod { metadata, spec, status } = p;
    let spec = spec.map(pod_spec).transpose()?;
    let status = status.map(pod_status).transpose()?;
    Ok(Fields::default()
        .put("metadata", object_meta(metadata))
        .object("spec", spec)
        .object("status", status)
        .done())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(api_version: &str, kind: &str, message: &impl Message) -> Vec<u8> {
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(message.encode_to_vec()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC, unknown.encode_to_vec().as_slice()].concat()
    }

    fn rt(plural: &str) -> ResourceType {
        crate::resources::builtins()
            .into_iter()
            .find(|t| t.group.is_empty() && t.plural == plural)
            .expect("a built-in kind")
    }

    #[test]
    fn garbage_and_other_kinds_get_clear_errors() {
        let e = decode(b"not protobuf", &rt("secrets")).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("magic"), "{}", e.message);
        let e = decode(b"k8s\0\xff\xff\xff", &rt("secrets")).unwrap_err();
        assert_eq!(e.code, 400);
        let leases = crate::resources::builtins()
            .into_iter()
            .find(|t| t.plural == "leases")
            .unwrap();
        let e = decode(
            &envelope("coordination.k8s.io/v1", "Lease", &core::Secret::default()),
            &leases,
        )
        .unwrap_err();
        assert_eq!(e.code, 415);
    }

    #[test]
    fn times_are_rfc3339_and_zero_is_absent() {
        assert_eq!(
            seconds_text(Some(1_767_225_600), Some(0), false).as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(
            seconds_text(Some(1_767_225_600), Some(123_456_789), true).as_deref(),
            Some("2026-01-01T00:00:00.123456Z")
        );
        assert_eq!(seconds_text(None, None, false), None);
        assert_eq!(seconds_text(Some(ZERO_TIME_SECONDS), Some(0), false), None);
    }

    #[test]
    fn a_pod_field_not_mapped_is_refused_by_name() {
        let pod = core::Pod {
            metadata: Some(meta::ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                containers: vec![core::Container {
                    name: Some("c".into()),
                    liveness_probe: Some(core::Probe::default()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        let e = decode(&envelope("v1", "Pod", &pod), &rt("pods")).unwrap_err();
        assert_eq!(e.code, 415);
        assert!(e.message.contains("spec.containers[0].livenessProbe"), "{}", e.message);
        let pod = core::Pod {
            spec: Some(core::PodSpec {
                volumes: vec![core::Volume::default()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = decode(&envelope("v1", "Pod", &pod), &rt("pods")).unwrap_err();
        assert!(e.message.contains("spec.volumes"), "{}", e.message);
    }
}
