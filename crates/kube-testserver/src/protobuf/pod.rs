//! A Pod: its common fields mapped; one that sets another (volumes, probes, security contexts,
//! affinity, ...) is refused by the field's path. Every message is destructured exhaustively,
//! so a field a newer `k8s-pb` adds does not compile until it is mapped or refused here.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as core;
use serde_json::Value;

use super::json::{Fields, time};
use super::meta::object_meta;
use super::refusal::{refuse_if, refuse_set};
use crate::status::ApiError;

fn quantities(q: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>) -> BTreeMap<String, String> {
    q.into_iter().map(|(k, v)| (k, v.string.unwrap_or_default())).collect()
}

fn container_port(p: core::ContainerPort) -> Value {
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
}

/// An environment variable at `at`; one taken from elsewhere (`valueFrom`) is refused.
fn env_var(v: core::EnvVar, at: &str) -> Result<Value, ApiError> {
    let core::EnvVar {
        name,
        value,
        value_from,
    } = v;
    refuse_if(value_from.is_some(), "Pod", &format!("{at}.valueFrom"))?;
    Ok(Fields::default().text("name", name).text("value", value).done())
}

/// A container's resources at `at`; claims are refused.
fn resources(r: core::ResourceRequirements, at: &str) -> Result<Value, ApiError> {
    let core::ResourceRequirements {
        limits,
        requests,
        claims,
    } = r;
    refuse_if(!claims.is_empty(), "Pod", &format!("{at}.claims"))?;
    Ok(Fields::default()
        .string_map("limits", quantities(limits))
        .string_map("requests", quantities(requests))
        .done())
}

fn volume_mount(m: core::VolumeMount) -> Value {
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
}

/// The container at path `at` (`spec.containers[0]`).
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
        resources: requirements,
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
    let vars = env
        .into_iter()
        .enumerate()
        .map(|(i, v)| env_var(v, &field(&format!("env[{i}]"))))
        .collect::<Result<Vec<_>, _>>()?;
    // Not omitempty in the Go type: a container shows `resources: {}`.
    let requirements = requirements.map(|r| resources(r, &field("resources"))).transpose()?;
    let mut out = Fields::default();
    out.text("name", name)
        .text("image", image)
        .strings("command", command)
        .strings("args", args)
        .text("workingDir", working_dir)
        .list("ports", ports.into_iter().map(container_port).collect())
        .list("env", vars);
    if let Some(r) = requirements {
        out.put("resources", r);
    }
    Ok(out
        .text("restartPolicy", restart_policy)
        .list("volumeMounts", volume_mounts.into_iter().map(volume_mount).collect())
        .text("terminationMessagePath", termination_message_path)
        .text("terminationMessagePolicy", termination_message_policy)
        .text("imagePullPolicy", image_pull_policy)
        .nonzero("stdin", stdin)
        .nonzero("stdinOnce", stdin_once)
        .nonzero("tty", tty)
        .done())
}

/// The containers of a list at `at` (`spec.containers`), each at its index.
fn containers(list: Vec<core::Container>, at: &str) -> Result<Vec<Value>, ApiError> {
    list.into_iter()
        .enumerate()
        .map(|(i, c)| container(c, &format!("{at}[{i}]")))
        .collect()
}

/// References by name alone (`imagePullSecrets`).
fn names_of(references: Vec<core::LocalObjectReference>) -> Vec<Value> {
    references
        .into_iter()
        .map(|r| Fields::default().text("name", r.name).done())
        .collect()
}

/// A Pod's spec; of two fields refused, the main containers' comes before the init containers'.
fn pod_spec(s: core::PodSpec) -> Result<Value, ApiError> {
    let core::PodSpec {
        volumes,
        init_containers,
        containers: main_containers,
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
    refuse_set(
        "Pod",
        &[
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
        ],
    )?;
    let main_containers = containers(main_containers, "spec.containers")?;
    Ok(Fields::default()
        .list("initContainers", containers(init_containers, "spec.initContainers")?)
        .put("containers", Value::Array(main_containers))
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
        .list("imagePullSecrets", names_of(image_pull_secrets))
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
    refuse_set(
        "Pod",
        &[
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
        ],
    )?;
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

pub(super) fn pod(p: core::Pod) -> Result<Value, ApiError> {
    let core::Pod { metadata, spec, status } = p;
    let spec = spec.map(pod_spec).transpose()?;
    let status = status.map(pod_status).transpose()?;
    Ok(Fields::default()
        .put("metadata", object_meta(metadata))
        .object("spec", spec)
        .object("status", status)
        .done())
}
