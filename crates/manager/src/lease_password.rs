//! `--lease-store-password-file`: the Redis lease store's password kept out of `--lease-store`
//! (and so out of the process list and the Deployment's arguments), read at start, where a
//! problem stops the start, then followed: a rotated password reaches the store's next
//! connection without a restart. The password is never logged, nor in any `Debug`.

use std::sync::Arc;

use egress_lease_redis::RedisStore;

use crate::followed::{Followed, Unusable, read_flag_file};

pub(crate) const FLAG: &str = "--lease-store-password-file";
/// The most a password file may hold.
const MAX_PASSWORD_FILE: u64 = 4096;

/// The password the file at `path` holds: its first line, without its line end.
pub(crate) fn read_password(path: &str) -> Result<String, Unusable> {
    let unusable = |why: String| Unusable {
        flag: FLAG,
        path: path.to_owned(),
        why,
    };
    let bytes = read_flag_file(path, MAX_PASSWORD_FILE, "which no password is").map_err(unusable)?;
    let text = String::from_utf8(bytes).map_err(|_| unusable("not UTF-8 text".to_owned()))?;
    let line = text.lines().next().unwrap_or_default().trim_end_matches('\r');
    if line.is_empty() {
        return Err(unusable("its first line is empty: no password".to_owned()));
    }
    Ok(line.to_owned())
}

/// Re-reads the password file and hands the store a changed password.
pub(crate) struct PasswordFollower {
    pub(crate) store: Arc<RedisStore>,
    pub(crate) path: String,
    /// The password the store's connection was made with.
    pub(crate) applied: String,
}

impl Followed for PasswordFollower {
    const CHANGED: &'static str = "Lease store password file changed; new calls to Redis authenticate with it";
    const UNUSABLE: &'static str = "Lease store password file cannot be used; the connection in use stays";

    fn check(&mut self) -> Result<bool, Unusable> {
        let password = read_password(&self.path)?;
        if password == self.applied {
            return Ok(false);
        }
        self.store.use_password(&password).map_err(|why| Unusable {
            flag: FLAG,
            path: self.path.clone(),
            why,
        })?;
        self.applied = password;
        Ok(true)
    }

    fn files(&self) -> String {
        self.path.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_the_first_line_and_an_empty_one_is_refused() {
        let dir = egress_testkit::scratch_dir("lease-password");
        let file = dir.join("password");
        std::fs::write(&file, "s3cret pass\r\nignored\n").unwrap();
        assert_eq!(read_password(file.to_str().unwrap()).unwrap(), "s3cret pass");
        std::fs::write(&file, "\nsecond\n").unwrap();
        let e = read_password(file.to_str().unwrap()).unwrap_err();
        assert_eq!((e.flag, e.why.as_str()), (FLAG, "its first line is empty: no password"));
        let e = read_password(dir.join("missing").to_str().unwrap()).unwrap_err();
        assert!(!e.why.contains("s3cret"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
