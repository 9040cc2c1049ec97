//! `mark_installation` on libvirt: the marks live in one element of the domain's `<metadata>`
//! ([`crate::mark`]), so marking reads that element, adds its `installation` child and writes it
//! back whole with `virDomainSetMetadata`, under the name's lock, so create and delete of the
//! name take turns with it. libvirt has no conditional metadata write: a writer of the same
//! element outside this process between the read and the write would be overwritten. None
//! exists: the Go operator wrote its mark only in the define, and another installation never
//! marks a domain of a Proxy it does not have.

use egress_provider::{Marking, Op, OpCtx, ProviderError, ProviderId, marking};

use super::{LibvirtProvider, owned_mark};
use crate::engine::failure::{Context as _, OpFailure};
use crate::engine::id;
use crate::host::Host;

impl LibvirtProvider {
    /// See [`egress_provider::Provider::mark_installation`].
    pub(super) async fn mark(&self, cx: &OpCtx, pid: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        let op = Op::Mark;
        let id = pid.as_str();
        let (host_name, name) = id::parse(id).map_err(|m| self.fail(op, id, OpFailure::permanent(m)))?;
        let host = self.host(host_name).ok_or_else(|| {
            self.fail(
                op,
                id,
                OpFailure::permanent(format!("host {host_name:?} is not in {}.hosts", self.block())),
            )
        })?;
        let _turn = self.shared.names.acquire(cx, name).await.map_err(|why| {
            self.fail(
                op,
                id,
                OpFailure::transient(format!("waiting for the lock on {name}: {why}")),
            )
        })?;
        let written = self
            .mark_on(cx, host.as_ref(), name, installation)
            .await
            .map_err(|f| self.fail(op, id, f))?;
        let label = self.generation().label();
        if written {
            tracing::debug!(host = host_name, name, installation, "{label} domain marked");
        } else {
            tracing::debug!(host = host_name, name, installation, "{label} domain already marked");
        }
        Ok(())
    }

    /// Marks domain `name` as `installation`'s; whether the mark had to be written.
    async fn mark_on(&self, cx: &OpCtx, host: &dyn Host, name: &str, installation: &str) -> Result<bool, OpFailure> {
        let generation = self.generation();
        let namespace = generation.namespace();
        let element = host
            .domain_metadata(cx, name, namespace)
            .await
            .doing(|| format!("reading the mark of domain {name}"))?;
        // A domain without this provider's mark is refused here, as get refuses it.
        let mut mark = owned_mark(generation, name, element)?;
        match marking(name, mark.managed, mark.installation.as_deref(), installation) {
            Marking::AlreadyMarked => return Ok(false),
            Marking::Refused(why) => return Err(OpFailure::permanent(why)),
            Marking::Write => {}
        }
        // Written back as parsed: the UID trimmed and lowercased, the creation time in whole
        // seconds (a time that did not parse stays empty, so still "very old" to GC).
        mark.installation = Some(installation.to_owned());
        let xml = mark
            .to_metadata_xml()
            .map_err(|e| OpFailure::permanent(e.to_string()))?;
        host.set_domain_metadata(cx, name, namespace, &xml)
            .await
            .doing(|| format!("writing the mark of domain {name}"))?;
        Ok(true)
    }
}
