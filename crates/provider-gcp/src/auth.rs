//! Access tokens by Application Default Credentials (spec/providers.md §5.3).
//!
//! Where credentials come from, in Google's order: the JSON key file that
//! `GOOGLE_APPLICATION_CREDENTIALS` names; gcloud's well-known file; the metadata server
//! (`GCE_METADATA_HOST` overrides its address). A key file is read at each refresh, never at
//! construction, so a Secret mounted later or rotated in place is picked up without a restart.
//!
//! One token is cached per provider and refreshed when under five minutes of validity remain;
//! concurrent callers wait for one refresh. `gcp_auth` signs the service-account assertion
//! (RS256 on ring); the exchanges themselves go through this crate's client, with its timeouts,
//! so the endpoints can be test servers.
//!
//! Nothing here logs, and no error carries the key, the assertion, a token or a client secret.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use tokio::sync::Mutex;

use crate::classify::RequestFailure;
use crate::transport::{read_capped, transport_text};

/// The scope every token asks for.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's token endpoint (authorized-user refresh; a service-account key names its own).
pub const GOOGLE_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";
/// The metadata server's address when `GCE_METADATA_HOST` is not set.
pub const METADATA_HOST: &str = "metadata.google.internal";
/// How long a metadata-server token request may take.
pub const METADATA_BUDGET: Duration = Duration::from_secs(5);
/// A token with less validity than this left is refreshed first.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// How long a signed assertion is valid.
const ASSERTION_LIFETIME: u64 = 3600;
/// The most of a key file or token answer read.
const MAX_DOCUMENT: usize = 64 * 1024;

/// Where tokens come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    /// A JSON key file (`service_account` or `authorized_user`), read at each refresh.
    KeyFile(PathBuf),
    /// The metadata server at `host` (`host[:port]`).
    Metadata {
        /// Address of the metadata server.
        host: String,
    },
}

impl CredentialSource {
    /// The source Application Default Credentials pick from this process's environment.
    pub fn from_environment() -> Self {
        Self::from_vars(|name| std::env::var(name).ok(), Path::is_file)
    }

    /// The source for environment variables `var` and files `is_file`: the key file
    /// `GOOGLE_APPLICATION_CREDENTIALS` names, else gcloud's well-known file under `HOME` if it
    /// is there, else the metadata server (`GCE_METADATA_HOST` or [`METADATA_HOST`]).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>, is_file: impl Fn(&Path) -> bool) -> Self {
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        if let Some(path) = var("GOOGLE_APPLICATION_CREDENTIALS") {
            return Self::KeyFile(PathBuf::from(path));
        }
        if let Some(home) = var("HOME") {
            let well_known = Path::new(&home).join(".config/gcloud/application_default_credentials.json");
            if is_file(&well_known) {
                return Self::KeyFile(well_known);
            }
        }
        Self::Metadata {
            host: var("GCE_METADATA_HOST").unwrap_or_else(|| METADATA_HOST.to_owned()),
        }
    }

    /// A key file that is not there yet (CRD2: warn, do not fail; calls answer Transient until
    /// it appears).
    pub fn missing_file(&self) -> Option<&Path> {
        match self {
            Self::KeyFile(p) if !p.exists() => Some(p),
            _ => None,
        }
    }
}

/// An access token. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// The `Authorization` header value.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessToken(..)")
    }
}

#[derive(Debug)]
struct Cached {
    token: AccessToken,
    refresh_after: Instant,
}

/// One provider's tokens.
#[derive(Debug)]
pub struct Tokens {
    source: CredentialSource,
    http: reqwest::Client,
    /// The authorized-user refresh endpoint ([`GOOGLE_TOKEN_URL`] but in tests).
    oauth_url: String,
    cached: Mutex<Option<Cached>>,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum KeyFile {
    #[serde(rename = "service_account")]
    ServiceAccount {
        client_email: String,
        private_key: String,
        #[serde(default)]
        private_key_id: String,
        #[serde(default)]
        token_uri: Option<String>,
    },
    #[serde(rename = "authorized_user")]
    AuthorizedUser {
        client_id: String,
        client_secret: String,
        refresh_token: String,
    },
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct TokenError {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

fn transient(message: impl Into<String>) -> RequestFailure {
    RequestFailure::Token {
        message: message.into(),
        permanent: false,
    }
}

fn permanent(message: impl Into<String>) -> RequestFailure {
    RequestFailure::Token {
        message: message.into(),
        permanent: true,
    }
}

/// An `application/x-www-form-urlencoded` body.
fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

fn b64(bytes: &[u8]) -> String {
    data_encoding::BASE64URL_NOPAD.encode(bytes)
}

impl Tokens {
    /// Tokens from `source`, fetched with `http`. Reads and contacts nothing yet.
    pub fn new(source: CredentialSource, http: reqwest::Client) -> Self {
        Self {
            source,
            http,
            oauth_url: GOOGLE_TOKEN_URL.to_owned(),
            cached: Mutex::new(None),
        }
    }

    /// Sends authorized-user refreshes to `url` instead of Google's endpoint (tests).
    pub fn with_oauth_url(mut self, url: impl Into<String>) -> Self {
        self.oauth_url = url.into();
        self
    }

    /// Where tokens come from.
    pub fn source(&self) -> &CredentialSource {
        &self.source
    }

    /// A token with at least [`REFRESH_MARGIN`] of validity left, refreshed first if needed.
    /// Concurrent callers share one refresh. The caller bounds the wait.
    ///
    /// # Errors
    /// [`RequestFailure::Token`]: no token could be had (Permanent only for a key file that is there
    /// but unusable).
    pub async fn token(&self) -> Result<AccessToken, RequestFailure> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref().filter(|c| Instant::now() < c.refresh_after) {
            return Ok(c.token.clone());
        }
        let (token, lifetime) = self.fetch().await?;
        let refresh_after = Instant::now() + lifetime.saturating_sub(REFRESH_MARGIN);
        *cached = Some(Cached {
            token: token.clone(),
            refresh_after,
        });
        Ok(token)
    }

    /// Forgets the cached token (after the API refused it).
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }

    async fn fetch(&self) -> Result<(AccessToken, Duration), RequestFailure> {
        match &self.source {
            CredentialSource::KeyFile(path) => self.fetch_from_key_file(path).await,
            CredentialSource::Metadata { host } => self.fetch_from_metadata(host).await,
        }
    }

    async fn fetch_from_key_file(&self, path: &Path) -> Result<(AccessToken, Duration), RequestFailure> {
        let shown = path.display();
        // The one bounded read: never more than the cap (the file is not read whole first), and
        // a pipe or a device in the file's place is refused rather than waited on.
        let text = match egress_files::read_regular_file_async(path, MAX_DOCUMENT as u64).await {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => {
                return Err(transient(format!("credential file {shown} does not exist (yet)")));
            }
            Err(e) => {
                return Err(match e.problem {
                    egress_files::Problem::TooLarge { .. } => {
                        permanent(format!("credential file {shown} is over {MAX_DOCUMENT} bytes"))
                    }
                    egress_files::Problem::NotRegular => {
                        permanent(format!("credential file {shown} is not a regular file"))
                    }
                    egress_files::Problem::Io(e) => transient(format!("reading credential file {shown}: {}", e.kind())),
                });
            }
        };
        // serde's message could quote the content: say only what kind of file it is, by its
        // `type` (not a secret) when it has one.
        let key: KeyFile = serde_json::from_slice(&text).map_err(|_| {
            let kind = serde_json::from_slice::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
            permanent(match kind {
                Some(kind) if kind != "service_account" && kind != "authorized_user" => format!(
                    "credential file {shown} is of type {:?}: only service_account and authorized_user are supported",
                    kind.chars().take(40).collect::<String>()
                ),
                _ => format!("credential file {shown} is not a usable service_account or authorized_user JSON key"),
            })
        })?;
        match key {
            KeyFile::ServiceAccount {
                client_email,
                private_key,
                private_key_id,
                token_uri,
            } => {
                let token_uri = token_uri
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| GOOGLE_TOKEN_URL.to_owned());
                let assertion = sign_assertion(&client_email, &private_key, &private_key_id, &token_uri)
                    .map_err(|why| permanent(format!("credential file {shown}: {why}")))?;
                let body = form(&[
                    ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                    ("assertion", &assertion),
                ]);
                self.exchange(self.http.post(&token_uri), body, &token_uri).await
            }
            KeyFile::AuthorizedUser {
                client_id,
                client_secret,
                refresh_token,
            } => {
                let body = form(&[
                    ("grant_type", "refresh_token"),
                    ("client_id", &client_id),
                    ("client_secret", &client_secret),
                    ("refresh_token", &refresh_token),
                ]);
                self.exchange(self.http.post(&self.oauth_url), body, &self.oauth_url)
                    .await
            }
        }
    }

    async fn fetch_from_metadata(&self, host: &str) -> Result<(AccessToken, Duration), RequestFailure> {
        let url = format!("http://{host}/computeMetadata/v1/instance/service-accounts/default/token");
        let request = self
            .http
            .get(&url)
            .header("Metadata-Flavor", "Google")
            .timeout(METADATA_BUDGET);
        self.answer(request, &url).await
    }

    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        body: String,
        url: &str,
    ) -> Result<(AccessToken, Duration), RequestFailure> {
        let request = request
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body);
        self.answer(request, url).await
    }

    async fn answer(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<(AccessToken, Duration), RequestFailure> {
        let endpoint = url.split('?').next().unwrap_or(url);
        let response = request
            .send()
            .await
            .map_err(|e| transient(format!("token endpoint {endpoint}: {}", transport_text(&e))))?;
        let status = response.status().as_u16();
        let body = read_capped(response, MAX_DOCUMENT)
            .await
            .map_err(|e| transient(format!("token endpoint {endpoint}: {e}")))?;
        if !(200..300).contains(&status) {
            let why = serde_json::from_slice::<TokenError>(&body)
                .map(|e| format!("{} {}", e.error, e.error_description))
                .unwrap_or_default();
            return Err(transient(egress_provider::redact(&format!(
                "token endpoint {endpoint} answered {status} {}",
                why.trim()
            ))));
        }
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|_| transient(format!("token endpoint {endpoint} answered without an access token")))?;
        if answer.access_token.is_empty() {
            return Err(transient(format!(
                "token endpoint {endpoint} answered an empty access token"
            )));
        }
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(ASSERTION_LIFETIME));
        Ok((AccessToken(answer.access_token), lifetime))
    }
}

/// The signed JWT a service account trades for a token: RS256 over
/// `{"alg","typ","kid"}.{"iss","scope","aud","iat","exp"}`.
fn sign_assertion(email: &str, pem: &str, key_id: &str, audience: &str) -> Result<String, &'static str> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": key_id});
    let claims = serde_json::json!({
        "iss": email,
        "scope": SCOPE,
        "aud": audience,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME,
    });
    let unsigned = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    // gcp_auth parses the PKCS#8 PEM and signs; its key-file reader wants these fields.
    let for_signer = serde_json::json!({
        "type": "service_account",
        "client_email": email,
        "private_key": pem,
        "token_uri": audience,
    });
    let account = gcp_auth::CustomServiceAccount::from_json(&for_signer.to_string())
        .map_err(|_| "its private_key is not a PKCS#8 RSA key")?;
    let signature = account
        .signer()
        .sign(unsigned.as_bytes())
        .map_err(|_| "signing with its private_key failed")?;
    Ok(format!("{unsigned}.{}", b64(&signature)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(
            form(&[
                ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                ("a b", "x/y+z")
            ]),
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&a+b=x%2Fy%2Bz"
        );
    }

    #[test]
    fn application_default_credentials_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
        };
        let well_known = PathBuf::from("/home/u/.config/gcloud/application_default_credentials.json");
        let everything = env(&[
            ("GOOGLE_APPLICATION_CREDENTIALS", "/var/run/key.json"),
            ("HOME", "/home/u"),
            ("GCE_METADATA_HOST", "10.0.0.1:8080"),
        ]);
        assert_eq!(
            CredentialSource::from_vars(everything, |_| true),
            CredentialSource::KeyFile("/var/run/key.json".into())
        );
        let home = env(&[("GOOGLE_APPLICATION_CREDENTIALS", ""), ("HOME", "/home/u")]);
        assert_eq!(
            CredentialSource::from_vars(home, |p| p == well_known),
            CredentialSource::KeyFile(well_known.clone())
        );
        let home = env(&[("HOME", "/home/u")]);
        assert_eq!(
            CredentialSource::from_vars(home, |_| false),
            CredentialSource::Metadata {
                host: METADATA_HOST.into()
            }
        );
        let host = env(&[("GCE_METADATA_HOST", "10.0.0.1:8080")]);
        assert_eq!(
            CredentialSource::from_vars(host, |_| false),
            CredentialSource::Metadata {
                host: "10.0.0.1:8080".into()
            }
        );
    }

    #[test]
    fn tokens_never_print() {
        let t = AccessToken("ya29.secret".into());
        assert!(!format!("{t:?}").contains("secret"));
        assert_eq!(t.bearer(), "Bearer ya29.secret");
    }

    /// What fetching a token from the key file at `path` failed with: the message and whether
    /// it is permanent.
    async fn key_file_failure(path: &Path) -> (String, bool) {
        let http = crate::client::http_client().expect("an HTTP client");
        let tokens = Tokens::new(CredentialSource::KeyFile(path.to_owned()), http);
        match tokens.token().await {
            Err(RequestFailure::Token { message, permanent }) => (message, permanent),
            other => panic!("{}: {other:?}", path.display()),
        }
    }

    #[tokio::test]
    async fn a_key_file_is_read_bounded_and_only_when_it_is_a_regular_file() {
        let dir = egress_testkit::ScratchDir::new("gcp-key-file");
        let (huge, pipe) = (dir.path().join("huge.json"), dir.path().join("pipe.json"));
        let padding = "SENTINEL".repeat(MAX_DOCUMENT / 8 + 1);
        std::fs::write(
            &huge,
            format!("{{\"type\": \"service_account\", \"pad\": \"{padding}\"}}"),
        )
        .unwrap();
        egress_testkit::make_fifo(&pipe);
        let (message, permanent) = key_file_failure(&huge).await;
        assert_eq!(
            (message.as_str(), permanent),
            (
                format!("credential file {} is over {MAX_DOCUMENT} bytes", huge.display()).as_str(),
                true
            )
        );
        // Nothing writes to the pipe: a read that waited would hang here.
        for odd in [pipe.as_path(), dir.path()] {
            let (message, permanent) = key_file_failure(odd).await;
            assert_eq!(
                message,
                format!("credential file {} is not a regular file", odd.display())
            );
            assert!(permanent, "{message}");
        }
        let missing = dir.path().join("missing.json");
        let (message, permanent) = key_file_failure(&missing).await;
        assert_eq!(
            message,
            format!("credential file {} does not exist (yet)", missing.display())
        );
        assert!(!permanent, "it may appear");
    }

    #[test]
    fn a_key_that_is_not_rsa_pkcs8_is_refused_without_quoting_it() {
        let e = sign_assertion(
            "a@b",
            "-----BEGIN PRIVATE KEY-----\nSECRETSTUFF\n-----END PRIVATE KEY-----\n",
            "k",
            "u",
        )
        .expect_err("garbage key");
        assert!(!e.contains("SECRETSTUFF"));
    }
}
