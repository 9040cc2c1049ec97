//! The lease store `--lease-store` names, and its TLS files (`--lease-store-ca-file`,
//! `--lease-store-client-cert-file`, `--lease-store-client-key-file`): read and checked at
//! start, where a problem stops the start, then followed (`followed.rs`), so a rotated CA or a
//! renewed client certificate reaches the store without a restart.

use std::sync::Arc;

use egress_lease_redis::{ClientIdentity, RedisStore, Tls, TlsRoots};

use crate::flags::Options;
use crate::followed::{Followed, Unusable, read_pem_file};
use crate::lease_password::PasswordFollower;
use egress_runtime::Fatal;

const FAILED: &str = "Failed to set up the lease store";

/// The store, and for a Redis with TLS files the task that follows them (to run until
/// shutdown).
pub(crate) struct LeaseStore {
    pub(crate) store: Arc<dyn egress_lease::LeaseStore>,
    pub(crate) follow_tls: Option<TlsFollower>,
    pub(crate) follow_password: Option<PasswordFollower>,
}

/// What `--lease-store` and its TLS files say, read and checked: everything but the key
/// prefix, which needs the installation id.
pub(crate) struct Prepared(Settings);

enum Settings {
    Memory,
    Redis(Box<RedisSettings>),
}

struct RedisSettings {
    /// Made under the default prefix, which [`Prepared::open`] replaces: making it checks the
    /// URL and the TLS settings, and contacts nothing.
    store: RedisStore,
    files: TlsFiles,
    read: TlsBytes,
    /// The password read from `--lease-store-password-file`, when given.
    password: Option<String>,
}

/// Reads and checks the store's settings and files. Contacts nothing, so a problem stops the
/// start before anything else is made.
pub(crate) fn prepare(options: &Options) -> Result<Prepared, Fatal> {
    let files = TlsFiles::of(options);
    if options.lease_store == "memory" {
        if let Some(flag) = files.named().next().map(|(flag, _)| flag) {
            return Err(Fatal::new(
                FAILED,
                format!("{flag} is for a lease store reached over TLS (rediss://)"),
            ));
        }
        if !options.lease_store_password_file.is_empty() {
            return Err(Fatal::new(
                FAILED,
                format!("{} is for a Redis lease store", crate::lease_password::FLAG),
            ));
        }
        if options.lease_store_shards != 1 {
            return Err(Fatal::new(
                FAILED,
                "--lease-store-shards is for a Redis lease store; the memory store has no shards".to_owned(),
            ));
        }
        return Ok(Prepared(Settings::Memory));
    }
    if let Some(unpaired) = files.unpaired() {
        return Err(Fatal::new(FAILED, unpaired.to_owned()));
    }
    let read = files.read().map_err(|u| u.fatal(FAILED))?;
    let tls = read.tls(&files).map_err(|u| u.fatal(FAILED))?;
    let password = match options.lease_store_password_file.as_str() {
        "" => None,
        path => Some(crate::lease_password::read_password(path).map_err(|u| u.fatal(FAILED))?),
    };
    let store = RedisStore::new_with_password(
        &options.lease_store,
        egress_lease_redis::DEFAULT_PREFIX,
        options.lease_cooldown,
        &tls,
        password.as_deref(),
    )
    .and_then(|store| store.with_unpooled_shards(options.lease_store_shards))
    .map_err(|e| Fatal::new(FAILED, e))?;
    Ok(Prepared(Settings::Redis(Box::new(RedisSettings {
        store,
        files,
        read,
        password,
    }))))
}

impl Prepared {
    /// The store, its Redis keys under the installation's own prefix (two installations
    /// sharing one Redis keep apart). Contacts nothing: a Redis that is down only makes lease
    /// calls answer 503 until it is up.
    pub(crate) fn open(self, options: &Options, installation: &str) -> Result<LeaseStore, Fatal> {
        let redis = match self.0 {
            Settings::Memory => {
                return Ok(LeaseStore {
                    store: Arc::new(egress_lease::MemoryStore::new(
                        Arc::new(egress_lease::SystemClock),
                        options.lease_cooldown,
                    )),
                    follow_tls: None,
                    follow_password: None,
                });
            }
            Settings::Redis(redis) => *redis,
        };
        let RedisSettings {
            store,
            files,
            read,
            password,
        } = redis;
        let prefix = format!("{}{installation}:", egress_lease_redis::DEFAULT_PREFIX);
        let store = Arc::new(store.with_prefix(&prefix).map_err(|e| Fatal::new(FAILED, e))?);
        tracing::info!(redis = %egress_lease_redis::shown_url(&options.lease_store), prefix, "Leases are kept in Redis");
        let any_file = files.named().next().is_some();
        let follow_tls = any_file.then(|| TlsFollower {
            store: store.clone(),
            files,
            applied: read,
        });
        let follow_password = password.map(|applied| PasswordFollower {
            store: store.clone(),
            path: options.lease_store_password_file.clone(),
            applied,
        });
        Ok(LeaseStore {
            store,
            follow_tls,
            follow_password,
        })
    }
}

/// The paths the three flags give; empty for a flag not given.
#[derive(Clone)]
struct TlsFiles {
    ca: String,
    client_cert: String,
    client_key: String,
}

/// What the files held when last read: the private key too, so no `Debug`, and never logged.
#[derive(PartialEq, Eq)]
struct TlsBytes {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    fn of(options: &Options) -> Self {
        Self {
            ca: options.lease_store_ca_file.clone(),
            client_cert: options.lease_store_client_cert_file.clone(),
            client_key: options.lease_store_client_key_file.clone(),
        }
    }

    /// The flags given, with their paths.
    fn named(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("--lease-store-ca-file", self.ca.as_str()),
            ("--lease-store-client-cert-file", self.client_cert.as_str()),
            ("--lease-store-client-key-file", self.client_key.as_str()),
        ]
        .into_iter()
        .filter(|(_, path)| !path.is_empty())
    }

    /// Why the client certificate and key flags are not given together, when they are not.
    fn unpaired(&self) -> Option<&'static str> {
        (self.client_cert.is_empty() != self.client_key.is_empty())
            .then_some("--lease-store-client-cert-file and --lease-store-client-key-file go together")
    }

    /// Each file given, read whole (see [`read_pem_file`]).
    fn read(&self) -> Result<TlsBytes, Unusable> {
        let read = |flag: &'static str, path: &str| {
            read_pem_file(path).map_err(|why| Unusable {
                flag,
                path: path.to_owned(),
                why,
            })
        };
        let ca = match self.ca.as_str() {
            "" => None,
            path => Some(read("--lease-store-ca-file", path)?),
        };
        let client = match (self.client_cert.as_str(), self.client_key.as_str()) {
            ("", _) | (_, "") => None,
            (cert, key) => Some((
                read("--lease-store-client-cert-file", cert)?,
                read("--lease-store-client-key-file", key)?,
            )),
        };
        Ok(TlsBytes { ca, client })
    }
}

impl TlsBytes {
    /// The TLS settings the files give, checked: CA certificates that are CA certificates, a
    /// client key that is the certificate's.
    fn tls(&self, files: &TlsFiles) -> Result<Tls, Unusable> {
        let roots = match &self.ca {
            None => TlsRoots::System,
            Some(pem) => TlsRoots::only(pem).map_err(|why| Unusable {
                flag: "--lease-store-ca-file",
                path: files.ca.clone(),
                why,
            })?,
        };
        let client = match &self.client {
            None => None,
            // The message says which of the two files is wrong.
            Some((cert, key)) => Some(ClientIdentity::from_pem(cert, key).map_err(|why| Unusable {
                flag: "--lease-store-client-cert-file and --lease-store-client-key-file",
                path: format!("{}, {}", files.client_cert, files.client_key),
                why,
            })?),
        };
        Ok(Tls { roots, client })
    }
}

/// Re-reads the TLS files and hands the store what changed.
pub(crate) struct TlsFollower {
    store: Arc<RedisStore>,
    files: TlsFiles,
    /// What the store's connection was made with.
    applied: TlsBytes,
}

impl Followed for TlsFollower {
    const CHANGED: &'static str = "Lease store TLS files changed; new calls to Redis use them";
    const UNUSABLE: &'static str = "Lease store TLS files cannot be used; the connection in use stays";

    /// Reads the files and, when they changed, hands the store their settings: the store's next
    /// calls go over a connection made with them. A Secret volume swaps its files at once;
    /// files changed one by one may show a new certificate with the old key for a round, which
    /// the next round then finds whole.
    fn check(&mut self) -> Result<bool, Unusable> {
        let read = self.files.read()?;
        if read == self.applied {
            return Ok(false);
        }
        let tls = read.tls(&self.files)?;
        // Refused only for a URL without TLS, which the start already refused. The message
        // names the store (without credentials).
        self.store.use_tls(&tls).map_err(|why| Unusable {
            flag: "--lease-store",
            path: self.files(),
            why,
        })?;
        self.applied = read;
        Ok(true)
    }

    fn files(&self) -> String {
        self.files.named().map(|(_, path)| path).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_testkit::secret_volume::Volume;

    fn follower(options: &Options) -> TlsFollower {
        let _ = rustls::crypto::ring::default_provider().install_default();
        prepare(options)
            .and_then(|p| p.open(options, "test"))
            .unwrap_or_else(|e| panic!("{:?}", e.error))
            .follow_tls
            .expect("TLS files to follow")
    }

    #[tokio::test]
    async fn changed_tls_files_reach_the_store_and_unusable_ones_change_nothing() {
        let (pki, other) = (egress_testkit::pki(), egress_testkit::pki());
        let mut volume = Volume::with_keys(
            "lease-store-tls",
            &[
                ("ca.pem", &pki.ca_pem),
                ("client.pem", &pki.client_cert_pem),
                ("client-key.pem", &pki.client_key_pem),
            ],
        );
        let options = Options {
            // Nothing listens there: the store connects lazily and this test makes no call.
            lease_store: "rediss://127.0.0.1:1".to_owned(),
            lease_store_ca_file: volume.file("ca.pem").display().to_string(),
            lease_store_client_cert_file: volume.file("client.pem").display().to_string(),
            lease_store_client_key_file: volume.file("client-key.pem").display().to_string(),
            ..Options::default()
        };
        let mut follower = follower(&options);
        assert_eq!(follower.check(), Ok(false), "nothing changed");
        // A rotated CA is handed over once.
        volume.update_keys(&[("ca.pem", &format!("{}{}", other.ca_pem, pki.ca_pem))]);
        assert_eq!(follower.check(), Ok(true));
        assert_eq!(follower.check(), Ok(false));
        // A new certificate with the old key: refused, and found whole once the key follows.
        volume.update_keys(&[("client.pem", &other.client_cert_pem)]);
        let mismatched = follower.check().expect_err("another certificate's key");
        assert_eq!(
            mismatched.flag,
            "--lease-store-client-cert-file and --lease-store-client-key-file"
        );
        assert!(mismatched.why.contains("does not fit"), "{mismatched:?}");
        assert!(
            !mismatched.why.contains("PRIVATE KEY") && !mismatched.why.contains(&pki.client_key_pem[40..80]),
            "{mismatched:?}"
        );
        volume.update_keys(&[("client-key.pem", &other.client_key_pem)]);
        assert_eq!(follower.check(), Ok(true));
        // A CA file that is no CA, then none at all: each refused, and what was handed over
        // stays what the next change is compared with.
        volume.update_keys(&[("ca.pem", "not a certificate\n")]);
        let garbage = follower.check().expect_err("no CA in it");
        assert_eq!(
            (garbage.flag, garbage.path.as_str()),
            ("--lease-store-ca-file", options.lease_store_ca_file.as_str())
        );
        assert!(garbage.why.contains("no certificate"), "{garbage:?}");
        std::fs::remove_file(&options.lease_store_ca_file).unwrap();
        assert_eq!(follower.check().expect_err("no file").flag, "--lease-store-ca-file");
        volume.update_keys(&[("ca.pem", &format!("{}{}", other.ca_pem, pki.ca_pem))]);
        assert_eq!(follower.check(), Ok(false), "back to what the store has");
    }

    #[test]
    fn the_start_names_the_flag_and_the_file() {
        let volume = Volume::with_keys("lease-store-tls-start", &[("ca.pem", "not a certificate\n")]);
        let ca = volume.file("ca.pem").display().to_string();
        let options = Options {
            lease_store: "rediss://127.0.0.1:1".to_owned(),
            lease_store_ca_file: ca.clone(),
            ..Options::default()
        };
        let Err(fatal) = prepare(&options) else {
            panic!("a CA file without a certificate was taken");
        };
        assert_eq!(fatal.message, "Failed to set up the lease store");
        assert_eq!(fatal.path.as_deref(), Some(ca.as_str()));
        assert!(
            fatal
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("--lease-store-ca-file: no certificate")),
            "{:?}",
            fatal.error
        );
        let memory = Options {
            lease_store: "memory".to_owned(),
            ..options
        };
        assert!(
            prepare(&memory)
                .err()
                .and_then(|f| f.error)
                .is_some_and(|e| e.contains("--lease-store-ca-file is for a lease store reached over TLS")),
        );
    }

    #[tokio::test]
    async fn shards_are_for_a_redis_store_and_are_taken_there() {
        let memory = Options {
            lease_store_shards: 4,
            ..Options::default()
        };
        let refused = prepare(&memory).err().and_then(|f| f.error).unwrap_or_default();
        assert!(
            refused.contains("--lease-store-shards is for a Redis lease store"),
            "{refused}"
        );
        let redis = Options {
            lease_store: "redis://127.0.0.1:1".to_owned(),
            ..memory
        };
        let Ok(Prepared(Settings::Redis(settings))) = prepare(&redis) else {
            panic!("a Redis store with four shards was refused");
        };
        assert!(
            format!("{:?}", settings.store).contains("unpooled: 4"),
            "{:?}",
            settings.store
        );
    }
}
