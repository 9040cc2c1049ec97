//! The guide a person gets once the run is up: what to try, in another terminal, against this
//! run's files, discovery API and target.

use std::path::Path;

use super::layout::{Discovery, Layout};

/// Prints the guide for the run of `layout` with the sample Proxies `names`, its discovery API
/// `discovery` and the local target at `target`.
pub(super) fn print(
    layout: &Layout,
    kubeconfig: &Path,
    discovery: &Discovery<'_>,
    target: std::net::SocketAddr,
    names: &[String],
    gateway_lines: &[Vec<String>],
) {
    let kubeconfig = kubeconfig.display();
    let ca = layout.file("ca.pem");
    let ca = ca.display();
    let log = layout.file("operator.log");
    let log = log.display();
    let target_url = format!("https://127.0.0.1:{}/", target.port());
    println!(
        "
The egress-proxy operator runs against a local Kubernetes test server, with {n} tinyproxy
proxies of the local provider. Try, in another terminal:

  # the Proxies, as kubectl sees them, and one with its events
  kubectl --kubeconfig {kubeconfig} get proxies
  kubectl --kubeconfig {kubeconfig} describe px {first}

  # the pool: its counts, its events, and a resize (its members drain before they go)
  kubectl --kubeconfig {kubeconfig} get ppool
  kubectl --kubeconfig {kubeconfig} describe ppool local-pool
  kubectl --kubeconfig {kubeconfig} scale ppool local-pool --replicas=3

  # the discovery API over TLS (its CA: {ca}; its token: {token_file}): list, then lease a
  # proxy in the EU for 60 s
  curl -s --cacert {ca} -H 'Authorization: Bearer {token}' {discovery}/v1/proxies
  curl -s --cacert {ca} -X POST -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' \\
       -d '{{\"selector\": {{\"geo\": \"eu\"}}, \"ttlSeconds\": 60}}' {discovery}/v1/leases
  # or one of the pool's members
  curl -s --cacert {ca} -X POST -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' \\
       -d '{{\"selector\": {{\"pool\": \"local-pool\"}}}}' {discovery}/v1/leases

  # traffic through the leased proxy: put the lease's proxy.url (http://user:password@ip:port;
  # the proxies demand the credentials the lease hands out) in place of PROXY_URL:
  # to the local target,
  curl --cacert {ca} -x PROXY_URL {target_url}
  # and to the internet, where this machine can reach it
  curl -x PROXY_URL https://www.gstatic.com/generate_204 -w '%{{http_code}}\\n'

  # give the lease back (its leaseID from the answer above)
  curl -s --cacert {ca} -X DELETE -H 'Authorization: Bearer {token}' {discovery}/v1/leases/LEASE_ID

  # or let the gateway lease for you: the proxy username routes, the password is the token;
  # over HTTP CONNECT through one of the pool's members,
  {http_line}
  # and over SOCKS5, sticky to one proxy for the session login-1
  {socks_line}

The operator's log: {log}
The gateway's log (one access line per tunnel): {gateway_log}
",
        n = names.len(),
        first = names.first().map_or("NAME", String::as_str),
        discovery = discovery.url,
        token = discovery.token,
        token_file = layout.file("discovery-token").display(),
        http_line = super::gateway::shell_line(&gateway_lines[0]),
        socks_line = super::gateway::shell_line(&gateway_lines[1]),
        gateway_log = layout.file("gateway.log").display(),
    );
}
