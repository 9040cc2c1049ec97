//! Reading an SSH private key from a key file's text.
//!
//! OpenSSH writes an ECDSA key's secret scalar as an SSH `mpint`, which drops leading zero
//! bytes, so about one NIST P-256 key in 256 that `ssh-keygen` makes stores its scalar in 31
//! bytes. OpenSSH reads such keys back; ssh-key 0.7 (the parser under russh) refuses every
//! P-256 scalar shorter than 32 bytes. A key it refuses for that reason is read again here with
//! its scalar widened to 32 bytes: the same number, so the same key.

use russh::keys::ssh_encoding::pem::DecodePem;
use russh::keys::ssh_encoding::{self, Decode, Encode, Reader, pem::PemLabel};
use russh::keys::{Error, PrivateKey};

/// The start of an OpenSSH private key container, after the PEM armour.
const MAGIC: &[u8] = b"openssh-key-v1\0";
/// The key type of an ECDSA key on NIST P-256.
const P256: &str = "ecdsa-sha2-nistp256";
/// The size of a P-256 scalar.
const P256_SCALAR: usize = 32;
/// An unencrypted container pads its private section to a multiple of this.
const BLOCK: usize = 8;

/// Parses a private key file's text (OpenSSH, PKCS#8 or PuTTY, as russh reads them), and also
/// reads the OpenSSH P-256 keys whose scalar is written in fewer than 32 bytes. Encrypted keys
/// are refused ([`Error::KeyIsEncrypted`]). The errors never carry the text.
pub fn decode_private_key(text: &str) -> Result<PrivateKey, Error> {
    let refused = match russh::keys::decode_secret_key(text, None) {
        Ok(key) => return Ok(key),
        Err(e) => e,
    };
    widened_p256_scalar(text)
        .and_then(|container| PrivateKey::from_bytes(&container).ok())
        .ok_or(refused)
}

/// The body of an `OPENSSH PRIVATE KEY` PEM document, undecoded.
struct Container(Vec<u8>);

impl PemLabel for Container {
    const PEM_LABEL: &'static str = "OPENSSH PRIVATE KEY";
}

impl Decode for Container {
    type Error = ssh_encoding::Error;

    fn decode(reader: &mut impl Reader) -> Result<Self, Self::Error> {
        let mut body = vec![0; reader.remaining_len()];
        reader.read(&mut body)?;
        Ok(Self(body))
    }
}

/// The binary container of `text` with its P-256 scalar widened to 32 bytes, when `text` is an
/// unencrypted OpenSSH container of one P-256 key whose scalar is shorter; `None` for anything
/// else (which is then not this module's to fix).
fn widened_p256_scalar(text: &str) -> Option<Vec<u8>> {
    let Container(body) = Container::decode_pem(text.trim()).ok()?;
    let mut r = body.strip_prefix(MAGIC)?;
    let cipher = String::decode(&mut r).ok()?;
    let kdf = String::decode(&mut r).ok()?;
    let kdf_options = Vec::<u8>::decode(&mut r).ok()?;
    let keys = u32::decode(&mut r).ok()?;
    let public = Vec::<u8>::decode(&mut r).ok()?;
    let private = Vec::<u8>::decode(&mut r).ok()?;
    if cipher != "none" || keys != 1 || !r.is_empty() {
        return None;
    }
    let private = widened_private_section(&private)?;
    let mut out = MAGIC.to_vec();
    cipher.encode(&mut out).ok()?;
    kdf.encode(&mut out).ok()?;
    kdf_options.encode(&mut out).ok()?;
    keys.encode(&mut out).ok()?;
    public.encode(&mut out).ok()?;
    private.encode(&mut out).ok()?;
    Some(out)
}

/// The unencrypted private section with its P-256 scalar widened, padded again.
fn widened_private_section(mut r: &[u8]) -> Option<Vec<u8>> {
    let checks = (u32::decode(&mut r).ok()?, u32::decode(&mut r).ok()?);
    let kind = String::decode(&mut r).ok()?;
    if kind != P256 {
        return None;
    }
    let curve = String::decode(&mut r).ok()?;
    let point = Vec::<u8>::decode(&mut r).ok()?;
    let scalar = Vec::<u8>::decode(&mut r).ok()?;
    let comment = Vec::<u8>::decode(&mut r).ok()?;
    // NB: a positive mpint shorter than the curve's size is the one case ssh-key refuses;
    // anything else is left to its own error.
    if scalar.is_empty() || scalar.len() >= P256_SCALAR || scalar[0] & 0x80 != 0 {
        return None;
    }
    let mut wide = vec![0; P256_SCALAR - scalar.len()];
    wide.extend_from_slice(&scalar);
    let mut out = Vec::new();
    checks.0.encode(&mut out).ok()?;
    checks.1.encode(&mut out).ok()?;
    kind.encode(&mut out).ok()?;
    curve.encode(&mut out).ok()?;
    point.encode(&mut out).ok()?;
    wide.encode(&mut out).ok()?;
    comment.encode(&mut out).ok()?;
    // The padding is 1, 2, 3... up to the block's end, as OpenSSH writes and checks it.
    for pad in 1..=BLOCK as u8 {
        if out.len() % BLOCK == 0 {
            break;
        }
        out.push(pad);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A P-256 key made by `ssh-keygen -t ecdsa` whose scalar OpenSSH wrote in 31 bytes (found
    /// by making keys until one was).
    const SHORT_SCALAR: &str = include_str!("../tests/keys/ecdsa-p256-short-scalar");
    const SHORT_SCALAR_PUB: &str = include_str!("../tests/keys/ecdsa-p256-short-scalar.pub");

    #[test]
    fn a_p256_key_whose_scalar_openssh_wrote_in_31_bytes_is_read() {
        // The workaround is needed while russh's own parser refuses the key; when this fails,
        // ssh-key reads such keys itself and the module can go.
        assert!(russh::keys::decode_secret_key(SHORT_SCALAR, None).is_err());
        let key = decode_private_key(SHORT_SCALAR).unwrap();
        let expected = russh::keys::PublicKey::from_openssh(SHORT_SCALAR_PUB.trim()).unwrap();
        assert_eq!(key.public_key().key_data(), expected.key_data());
        assert_eq!(key.comment().as_bytes(), b"fixture");
        let ecdsa = key.key_data().ecdsa().unwrap();
        let russh::keys::ssh_key::private::EcdsaKeypair::NistP256 { private, .. } = ecdsa else {
            panic!("not P-256: {ecdsa:?}");
        };
        assert_eq!(
            private.as_slice()[0],
            0,
            "the scalar's first byte is the widening's zero"
        );
    }

    #[test]
    fn a_widened_key_signs_what_its_public_key_verifies() {
        let key = decode_private_key(SHORT_SCALAR).unwrap();
        let signature = key.sign("test", russh::keys::HashAlg::Sha256, b"message").unwrap();
        key.public_key().verify("test", b"message", &signature).unwrap();
        assert!(key.public_key().verify("test", b"another", &signature).is_err());
    }

    #[test]
    fn other_keys_and_other_text_keep_russhs_answer() {
        // Not a key at all, a public key, and a truncated container: the error russh gave.
        for text in ["", "hello", SHORT_SCALAR_PUB] {
            assert!(
                matches!(decode_private_key(text), Err(Error::CouldNotReadKey)),
                "{text:?}"
            );
        }
        let cut: String = SHORT_SCALAR
            .lines()
            .take(3)
            .chain(SHORT_SCALAR.lines().last())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(decode_private_key(&cut).is_err());
    }
}
