//! An address range: parsed strictly, compared, and written as Squid and people read it.

use std::fmt;
use std::net::IpAddr;

/// An address range, `address/prefix`; a lone address is its whole-length range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    network: IpAddr,
    prefix: u8,
}

fn bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn value(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The bits below a prefix of `prefix` in an address of `bits`.
fn host_mask(bits: u8, prefix: u8) -> u128 {
    let host_bits = u32::from(bits - prefix);
    if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

impl Range {
    /// Parses `address/prefix` or a lone address.
    ///
    /// # Errors
    /// Not an address, a prefix longer than the address, or host bits set below the prefix (a
    /// typo that would otherwise mean another range than the one meant).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?} is not an address or address/prefix range"))?;
        let bits = bits(network);
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("{text:?}: the prefix must be a number from 0 to {bits}"))?,
        };
        if value(network) & host_mask(bits, prefix) != 0 {
            return Err(format!("{text:?} has bits set below its /{prefix} prefix"));
        }
        Ok(Self { network, prefix })
    }

    /// Whether `ip` is in the range (an address of the other family never is).
    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.network.is_ipv4() {
            return false;
        }
        value(ip) & !host_mask(bits(ip), self.prefix) == value(self.network)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}
