//! Every Proxy and ProxyPool the repository ships in deploy/samples is accepted by the CRD as
//! installed (its schema and CEL rules, on the test API server), sent as written, so a misspelt
//! field or a credentials type on the wrong mode fails here and not in a user's cluster.

use std::path::{Path, PathBuf};

use egress_api::{Proxy, ProxyPool};
use egress_kube_testserver::TestServer;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};

fn samples() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("local"), root.join("other-providers")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let yaml = path.extension().is_some_and(|e| e == "yaml");
            if yaml && path.file_name().is_some_and(|n| n != "kustomization.yaml") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn every_shipped_sample_is_a_valid_proxy() {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .custom_resource::<ProxyPool>()
        .namespace("samples")
        .start()
        .await
        .unwrap();
    let api = |resource: ApiResource| -> Api<DynamicObject> {
        Api::namespaced_with(server.client().unwrap(), "samples", &resource)
    };
    let (proxies, pools) = (
        api(ApiResource::erase::<Proxy>(&())),
        api(ApiResource::erase::<ProxyPool>(&())),
    );
    let files = samples();
    assert!(files.len() >= 9, "{files:?}");
    let mut kinds = std::collections::BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let objects: Vec<DynamicObject> =
            serde_saphyr::from_str_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The Proxies and pools; a Secret beside one is the user's part.
        for object in &objects {
            let kind = object.types.as_ref().map(|t| t.kind.as_str());
            let api = match kind {
                Some("Proxy") => &proxies,
                Some("ProxyPool") => &pools,
                _ => continue,
            };
            kinds.insert(kind.unwrap_or_default().to_owned());
            api.create(&PostParams::default(), object)
                .await
                .unwrap_or_else(|e| panic!("{} refused: {e}", path.display()));
        }
    }
    assert_eq!(kinds, ["Proxy".to_owned(), "ProxyPool".to_owned()].into());
}
