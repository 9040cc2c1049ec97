//! What GeoIP data says about an exit address: its country, its autonomous system and that
//! system's organisation, from MaxMind DB files (GeoLite2, DB-IP Lite and the like ship one for
//! country or city and one for ASN) read by their documented fields with the `maxminddb` crate:
//! `country.iso_code`, `autonomous_system_number`, `autonomous_system_organization`.
//!
//! ```text
//!  --geoip-country-file ─┐  read whole (≤ 32 MiB each), checked, kept;   ┌► lookup(ip) ─► Geo
//!  --geoip-asn-file ─────┘  read again when the file changes (followed) ─┘
//! ```
//!
//! Each file is read into memory (the crates forbid the unsafe a memory map needs), so the cap
//! keeps the manager inside its 128 MiB: a country database (a few MB) fits, a city one (about
//! 60 MB) does not. A file that is missing or cannot be used leaves what was read before.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use egress_files::{Followed, read_regular_file};

#[cfg(feature = "testing")]
pub mod testing;

/// The largest database file read.
pub const MAX_DATABASE_BYTES: u64 = 32 * 1024 * 1024;

/// What the databases say about one address; each part absent when its database is, or when
/// the address is not in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Geo {
    /// ISO 3166-1 alpha-2.
    pub country: Option<String>,
    pub asn: Option<u32>,
    pub organization: Option<String>,
}

/// Why a database file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GeoIP database {path}: {problem}")]
pub struct GeoError {
    pub path: PathBuf,
    pub problem: String,
}

/// The databases in force. Clones share them; a followed file replaces its database for all.
#[derive(Debug, Clone, Default)]
pub struct GeoIp(Arc<RwLock<Databases>>);

#[derive(Debug, Default)]
struct Databases {
    country: Option<maxminddb::Reader<Vec<u8>>>,
    asn: Option<maxminddb::Reader<Vec<u8>>>,
}

/// Which database a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Country or city: `country.iso_code`.
    Country,
    /// `autonomous_system_number` and `autonomous_system_organization`.
    Asn,
}

impl GeoIp {
    /// What the databases in force say about `ip`. A lookup that fails (a corrupt record) counts
    /// as the address not being in that database.
    pub fn lookup(&self, ip: IpAddr) -> Geo {
        let dbs = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let country = dbs.country.as_ref().and_then(|r| {
            let found = r.lookup(ip).ok()?;
            let code: Option<&str> = found.decode_path(&maxminddb::path!["country", "iso_code"]).ok()?;
            code.map(str::to_owned)
        });
        let (asn, organization) = dbs.asn.as_ref().map_or((None, None), |r| {
            let Ok(found) = r.lookup(ip) else {
                return (None, None);
            };
            let number: Option<u32> = found
                .decode_path(&maxminddb::path!["autonomous_system_number"])
                .ok()
                .flatten();
            let name: Option<&str> = found
                .decode_path(&maxminddb::path!["autonomous_system_organization"])
                .ok()
                .flatten();
            (number, name.map(str::to_owned))
        });
        Geo {
            country,
            asn,
            organization,
        }
    }

    /// Whether a country database is in force (without one, `spec.exit.countries` cannot be
    /// checked).
    pub fn has_country(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .country
            .is_some()
    }

    /// Puts `reader` in force as the `kind` database.
    fn set(&self, kind: Kind, reader: maxminddb::Reader<Vec<u8>>) {
        let mut dbs = self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        match kind {
            Kind::Country => dbs.country = Some(reader),
            Kind::Asn => dbs.asn = Some(reader),
        }
    }

    /// Reads the `kind` database at `path` and puts it in force.
    ///
    /// # Errors
    /// The file cannot be read (missing, not a regular file, over [`MAX_DATABASE_BYTES`]), is
    /// not a MaxMind DB, or lacks the fields `kind` reads.
    pub fn load(&self, kind: Kind, path: &Path) -> Result<(), GeoError> {
        let reader = open(kind, path)?;
        self.set(kind, reader);
        Ok(())
    }
}

/// Reads and checks one database file.
fn open(kind: Kind, path: &Path) -> Result<maxminddb::Reader<Vec<u8>>, GeoError> {
    let fail = |problem: String| GeoError {
        path: path.to_owned(),
        problem,
    };
    let bytes = read_regular_file(path, MAX_DATABASE_BYTES).map_err(|e| fail(e.problem.to_string()))?;
    let reader = maxminddb::Reader::from_source(bytes).map_err(|e| fail(format!("not a MaxMind DB: {e}")))?;
    let kind_of_file = reader.metadata().database_type.to_ascii_lowercase();
    let looks_right = match kind {
        Kind::Country => kind_of_file.contains("country") || kind_of_file.contains("city"),
        Kind::Asn => kind_of_file.contains("asn"),
    };
    if !looks_right {
        return Err(fail(format!(
            "its database type is {:?}, not a {} database",
            reader.metadata().database_type,
            match kind {
                Kind::Country => "country or city",
                Kind::Asn => "ASN",
            }
        )));
    }
    Ok(reader)
}

/// One database file followed: read again when its identity or size or time changed, put in
/// force when it reads and checks well.
#[derive(Debug)]
pub struct DatabaseFile {
    geoip: GeoIp,
    kind: Kind,
    path: PathBuf,
    /// What the file was (device, inode, size, modification time) when last read.
    seen: Option<(u64, u64, u64, i64)>,
}

impl DatabaseFile {
    /// Follows the `kind` database at `path` for `geoip` (read at the first check).
    pub fn new(geoip: GeoIp, kind: Kind, path: PathBuf) -> Self {
        Self {
            geoip,
            kind,
            path,
            seen: None,
        }
    }
}

impl Followed for DatabaseFile {
    type Change = PathBuf;
    type Problem = GeoError;

    fn check(&mut self) -> Result<Option<PathBuf>, GeoError> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(&self.path).map_err(|e| GeoError {
            path: self.path.clone(),
            problem: e.to_string(),
        })?;
        let now = Some((meta.dev(), meta.ino(), meta.len(), meta.mtime()));
        if now == self.seen {
            return Ok(None);
        }
        let reader = open(self.kind, &self.path)?;
        self.geoip.set(self.kind, reader);
        self.seen = now;
        Ok(Some(self.path.clone()))
    }

    fn changed(&self, path: &PathBuf) {
        tracing::info!(file = %path.display(), "GeoIP database read; new lookups use it");
    }

    fn unusable(&self, problem: &GeoError) {
        tracing::warn!(error = %problem, "GeoIP database not usable; the one read before stays");
    }
}
