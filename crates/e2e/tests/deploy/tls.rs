//! The discovery API's TLS as installed: the default install's gateway trusts the CA of the
//! Secret `discovery-tls` over `https://`, the manager's arguments parse and make the
//! certificate itself; `deploy/cert-manager` has a Certificate write that Secret and the
//! manager serve it from files it follows.

use egress_manager::flags::{self, Command, DiscoveryTls};
use serde_json::Value;

use super::policies::deployment;
use super::{render, strings};

/// The volume `name` of a Deployment's Pod.
fn volume<'a>(d: &'a Value, name: &str) -> &'a Value {
    d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

#[test]
fn the_default_install_serves_tls_and_its_gateway_trusts_the_secrets_ca() {
    let test = "the_default_install_serves_tls_and_its_gateway_trusts_the_secrets_ca";
    let Some(rendered) = render("default", test) else {
        return;
    };
    let manager = deployment(&rendered, "egress-proxies-operator-controller-manager");
    let args = strings(&manager["spec"]["template"]["spec"]["containers"][0]["args"]);
    let Ok(Command::Run(o)) = flags::parse(args.clone()) else {
        panic!("{args:?} do not parse");
    };
    assert_eq!(o.discovery_tls, DiscoveryTls::Auto);
    assert!(
        o.discovery_tls_cert_file.is_empty(),
        "the manager makes the certificate"
    );
    assert_eq!(manager["spec"]["template"]["spec"]["securityContext"]["fsGroup"], 65532);
    assert_eq!(volume(manager, "kvm-ssh")["secret"]["defaultMode"], 0o440);

    let gateway = deployment(&rendered, "egress-proxies-operator-gateway");
    let args = strings(&gateway["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.iter().any(|a| a.starts_with("--discovery-url=https://")),
        "{args:?}"
    );
    assert!(
        args.contains(&"--discovery-ca-file=/etc/egress-gateway/discovery-tls/ca.crt".to_owned()),
        "{args:?}"
    );
    let secret = &volume(gateway, "discovery-tls")["secret"];
    assert_eq!(secret["secretName"], "discovery-tls");
    assert_eq!(secret["items"][0]["key"], "ca.crt");
}

#[test]
fn the_cert_manager_install_has_the_manager_serve_the_certificates_files() {
    let test = "the_cert_manager_install_has_the_manager_serve_the_certificates_files";
    let Some(rendered) = render("cert-manager", test) else {
        return;
    };
    let manager = deployment(&rendered, "egress-proxies-operator-controller-manager");
    let container = &manager["spec"]["template"]["spec"]["containers"][0];
    let args = strings(&container["args"]);
    let Ok(Command::Run(o)) = flags::parse(args.clone()) else {
        panic!("{args:?} do not parse");
    };
    assert_eq!(o.discovery_tls_cert_file, "/etc/proxy-operator/discovery-tls/tls.crt");
    assert_eq!(o.discovery_tls_key_file, "/etc/proxy-operator/discovery-tls/tls.key");
    let mounted = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "discovery-tls" && m["mountPath"] == "/etc/proxy-operator/discovery-tls");
    assert!(mounted, "{container}");
    assert_eq!(
        volume(manager, "discovery-tls")["secret"]["secretName"],
        "discovery-tls"
    );
    let certificate = rendered
        .iter()
        .find(|v| v["kind"] == "Certificate" && v["spec"]["secretName"] == "discovery-tls")
        .expect("a Certificate writing discovery-tls");
    let names = strings(&certificate["spec"]["dnsNames"]);
    assert!(
        names.contains(
            &"egress-proxies-operator-controller-manager-discovery-service.egress-proxies-operator-system.svc"
                .to_owned()
        ),
        "{names:?}"
    );
    let issuer = certificate["spec"]["issuerRef"]["name"].as_str().unwrap();
    assert!(
        rendered
            .iter()
            .any(|v| v["kind"] == "Issuer" && v["metadata"]["name"] == issuer),
        "the Certificate's issuer {issuer} is in the install"
    );
}
