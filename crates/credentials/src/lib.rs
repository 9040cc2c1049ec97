//! Proxy credentials: the user name and password a client shows a proxy in
//! `Proxy-Authorization: Basic ...`.
//!
//! - [`Credentials::generate`] mints a random pair made of letters and digits only, so it goes
//!   into a URL, a header, a tinyproxy config line or an htpasswd file without any escaping.
//! - [`Credentials::htpasswd_line`] is the form a proxy checks against without knowing the
//!   password: `user:$6$...`, SHA-512-crypt with a random salt, which glibc's `crypt(3)` (and so
//!   Squid's `basic_ncsa_auth`) reads.
//! - `Debug` never shows the password, and nothing here puts it into an error.
//!
//! The keys of the Kubernetes Secret that holds a Proxy's credentials are named here too, so the
//! operator that writes it and the providers that read it agree.

mod redact;

use std::fmt;

use sha_crypt::{PasswordHasher as _, ShaCrypt};

pub use redact::redact;

/// The Secret key of the user name.
pub const USERNAME_KEY: &str = "username";
/// The Secret key of the password.
pub const PASSWORD_KEY: &str = "password";
/// The Secret key of the htpasswd line (the user name and a salted hash, never the password).
pub const HTPASSWD_KEY: &str = "htpasswd";

/// The longest user name accepted (what proxies' configs and htpasswd files comfortably hold).
pub const MAX_USERNAME: usize = 128;
/// The longest password accepted.
pub const MAX_PASSWORD: usize = 256;

/// Length of a generated user name, including its leading `u`.
const GENERATED_USERNAME: usize = 16;
/// Length of a generated password: 32 letters and digits, about 190 bits.
const GENERATED_PASSWORD: usize = 32;
/// Bytes of salt for the htpasswd hash (16 characters once encoded, SHA-crypt's maximum).
const SALT_BYTES: usize = 12;

const LOWER_AND_DIGITS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const LETTERS_AND_DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Why a user name or password cannot be used. The text names the rule, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("the user name is empty")]
    EmptyUsername,
    #[error("the password is empty")]
    EmptyPassword,
    #[error("the user name is longer than {MAX_USERNAME} bytes")]
    UsernameTooLong,
    #[error("the password is longer than {MAX_PASSWORD} bytes")]
    PasswordTooLong,
    #[error("the user name contains ':', which Basic authentication cannot carry")]
    ColonInUsername,
    #[error("the {0} contains a control character")]
    ControlCharacter(&'static str),
}

/// A user name and password. Cloning copies the password; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

fn random_text(alphabet: &[u8], len: usize) -> String {
    (0..len)
        .map(|_| char::from(alphabet[rand::random_range(0..alphabet.len())]))
        .collect()
}

impl Credentials {
    /// A user name and password as given (a user's Secret), checked for what Basic
    /// authentication can carry.
    ///
    /// # Errors
    ///
    /// Either is empty or too long, the user name holds `:`, or either holds a control
    /// character (which would split a header or a config line).
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Result<Self, CredentialsError> {
        let (username, password) = (username.into(), password.into());
        if username.is_empty() {
            return Err(CredentialsError::EmptyUsername);
        }
        if password.is_empty() {
            return Err(CredentialsError::EmptyPassword);
        }
        if username.len() > MAX_USERNAME {
            return Err(CredentialsError::UsernameTooLong);
        }
        if password.len() > MAX_PASSWORD {
            return Err(CredentialsError::PasswordTooLong);
        }
        if username.contains(':') {
            return Err(CredentialsError::ColonInUsername);
        }
        if username.chars().any(char::is_control) {
            return Err(CredentialsError::ControlCharacter("user name"));
        }
        if password.chars().any(char::is_control) {
            return Err(CredentialsError::ControlCharacter("password"));
        }
        Ok(Self { username, password })
    }

    /// A fresh random pair: `u` and 15 lower-case letters or digits, and 32 letters or digits.
    pub fn generate() -> Self {
        let username = format!("u{}", random_text(LOWER_AND_DIGITS, GENERATED_USERNAME - 1));
        let password = random_text(LETTERS_AND_DIGITS, GENERATED_PASSWORD);
        Self { username, password }
    }

    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password itself. Only for the places that must carry it: the Secret, the lease
    /// answer, a proxy config that takes it in clear (tinyproxy), the probe's header.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Whether both parts are made of letters and digits only (generated ones are), so they fit
    /// a config line or a URL as they are.
    pub fn is_plain(&self) -> bool {
        let plain = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric());
        plain(&self.username) && plain(&self.password)
    }

    /// The value of a `Proxy-Authorization` header: `Basic <base64 of user:password>`.
    pub fn basic_authorization(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!("Basic {}", data_encoding::BASE64.encode(pair.as_bytes()))
    }

    /// The htpasswd line for these credentials: `user:$6$rounds=5000$<salt>$<hash>`, with a
    /// fresh random salt at each call.
    pub fn htpasswd_line(&self) -> String {
        let salt: [u8; SALT_BYTES] = rand::random();
        let hash = ShaCrypt::SHA512
            .hash_password_with_salt(self.password.as_bytes(), &salt)
            .map_or_else(
                |_| unreachable!("SHA-512-crypt takes any password and a 12-byte salt"),
                |h| h.to_string(),
            );
        format!("{}:{hash}", self.username)
    }

    /// Whether `line` is an htpasswd line for these credentials (the user name matches and the
    /// password hashes to the same value under the line's salt).
    pub fn matches_htpasswd(&self, line: &str) -> bool {
        use sha_crypt::PasswordVerifier as _;
        let Some((user, hash)) = line.trim_end().split_once(':') else {
            return false;
        };
        user == self.username
            && ShaCrypt::default()
                .verify_password(self.password.as_bytes(), hash)
                .is_ok()
    }

    /// `http://user:password@host:port`, the user name and password percent-encoded, an IPv6
    /// host in brackets.
    pub fn proxy_url(&self, host: &str, port: u16) -> String {
        use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
        // RFC 3986 userinfo: unreserved characters stay, everything else is encoded.
        const USERINFO: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        format!(
            "http://{}:{}@{host}:{port}",
            utf8_percent_encode(&self.username, USERINFO),
            utf8_percent_encode(&self.password, USERINFO)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_credentials_are_plain_random_and_the_right_length() {
        let a = Credentials::generate();
        let b = Credentials::generate();
        assert_ne!(a, b);
        assert!(a.is_plain());
        assert_eq!((a.username().len(), a.password().len()), (16, 32));
        assert!(a.username().starts_with('u'));
        assert!(
            a.username()
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert!(Credentials::new(a.username(), a.password()).is_ok());
    }

    #[test]
    fn debug_never_shows_the_password() {
        let c = Credentials::new("alice", "SENTINEL-pw").unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("SENTINEL"), "{shown}");
        assert!(shown.contains("alice"));
    }

    #[test]
    fn what_basic_authentication_cannot_carry_is_refused_without_echo() {
        let cases = [
            (("", "p"), CredentialsError::EmptyUsername),
            (("u", ""), CredentialsError::EmptyPassword),
            (("a:b", "SECRETpw"), CredentialsError::ColonInUsername),
            (("u", "SECRET\r\nX: y"), CredentialsError::ControlCharacter("password")),
            (("u\n", "SECRETpw"), CredentialsError::ControlCharacter("user name")),
        ];
        for ((user, password), want) in cases {
            let err = Credentials::new(user, password).unwrap_err();
            assert_eq!(err, want);
            assert!(!err.to_string().contains("SECRET"));
        }
        assert_eq!(
            Credentials::new("u".repeat(MAX_USERNAME + 1), "p").unwrap_err(),
            CredentialsError::UsernameTooLong
        );
        assert_eq!(
            Credentials::new("u", "p".repeat(MAX_PASSWORD + 1)).unwrap_err(),
            CredentialsError::PasswordTooLong
        );
        // Spaces and symbols are fine in a user's own password; they are just not "plain".
        let spaced = Credentials::new("u", "a b@c").unwrap();
        assert!(!spaced.is_plain());
    }

    #[test]
    fn the_basic_header_is_base64_of_user_colon_password() {
        let c = Credentials::new("Aladdin", "open sesame").unwrap();
        // RFC 7617's example.
        assert_eq!(c.basic_authorization(), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
    }

    #[test]
    fn the_htpasswd_line_is_salted_sha512_crypt_and_verifies() {
        let c = Credentials::new("alice", "s3cret").unwrap();
        let line = c.htpasswd_line();
        let (user, hash) = line.split_once(':').unwrap();
        assert_eq!(user, "alice");
        assert!(hash.starts_with("$6$"), "{hash}");
        assert!(!line.contains("s3cret"));
        assert!(c.matches_htpasswd(&line));
        assert!(!Credentials::new("alice", "s3cre7").unwrap().matches_htpasswd(&line));
        assert!(!Credentials::new("bob", "s3cret").unwrap().matches_htpasswd(&line));
        // A new salt each time.
        assert_ne!(c.htpasswd_line(), line);
        // The value `openssl passwd -6 -salt abcdefgh s3cret` prints, as glibc computes it.
        let glibc =
            "alice:$6$abcdefgh$Z7KfoKnKTSZrzo5VZ0YubGLQOj9ov6sHo9TmE3zIU/LHKhpE30zCnZ0mcIXYf9r9rQ4DYaXoxAFSPFlcWdxjB.";
        assert!(c.matches_htpasswd(glibc));
    }

    #[test]
    fn the_proxy_url_encodes_userinfo_and_brackets_ipv6() {
        let c = Credentials::new("u1", "pw").unwrap();
        assert_eq!(c.proxy_url("10.0.0.7", 3128), "http://u1:pw@10.0.0.7:3128");
        assert_eq!(c.proxy_url("fd00::7", 3128), "http://u1:pw@[fd00::7]:3128");
        let odd = Credentials::new("a b", "p@ss:w/rd").unwrap();
        assert_eq!(odd.proxy_url("h", 1), "http://a%20b:p%40ss%3Aw%2Frd@h:1");
    }
}
