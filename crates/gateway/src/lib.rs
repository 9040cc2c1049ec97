//! The gateway: one proxy endpoint for any crawler. A client authenticates with a discovery
//! token as its proxy password and says what it wants in its proxy username
//! ([`username`]); each connection is then routed through a proxy leased for it from the
//! discovery API, with that proxy's credentials, which the client never sees ([`chain`]).
//!
//! Built so far: the username grammar and the chaining through a backend. The fronts (HTTP
//! `CONNECT`, plain-HTTP forwarding, SOCKS5), the leases behind the scenes and the binary come
//! next (issue "The gateway").

pub mod chain;
pub mod username;
