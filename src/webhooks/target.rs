//! Which URLs may be webhook endpoints: the SSRF rules.
//!
//! They follow `http_request`'s (`crate::tools::http_request`): only `http`
//! and `https`, a host required, no redirect followed (a 3xx is a failed
//! attempt, as Standard Webhooks advises). `http_request` checks host names
//! against an operator's allow-list; an endpoint's URL comes from a tenant,
//! so here it is the *addresses* that are checked: loopback only when
//! `allow_loopback` (tests, a receiver on the same machine), private ranges
//! only when `allow_private`, and link-local (cloud metadata at
//! 169.254.169.254), unspecified, multicast, broadcast and reserved ranges
//! never. A name is resolved at registration (refused with the reason if any
//! address it has is refused) and again at every connection, through a
//! resolver that drops refused addresses, so a name re-pointed at an
//! internal address later (DNS rebinding) reaches nothing.
//!
//! It owns the rules and the resolver; it sends nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;

/// How long a name may take to resolve at registration.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which addresses endpoints may have (`[webhooks] allow_loopback`,
/// `allow_private`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetRules {
    /// 127.0.0.0/8, ::1 (and `localhost`).
    pub allow_loopback: bool,
    /// 10/8, 172.16/12, 192.168/16, 100.64/10 (carrier-grade NAT), fc00::/7.
    pub allow_private: bool,
}

/// Why a URL may not be an endpoint. Each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Not a URL.
    #[error("'{url}' is not a URL like https://hooks.example.com/overseer: {reason}")]
    Malformed {
        /// As given.
        url: String,
        /// The parser's reason.
        reason: String,
    },
    /// Another scheme.
    #[error("only http and https URLs may be endpoints, not '{0}'")]
    Scheme(String),
    /// User and password in the URL.
    #[error("must not contain credentials (the signature authenticates deliveries)")]
    Credentials,
    /// No host.
    #[error("has no host")]
    NoHost,
    /// An address of a refused class.
    #[error(
        "{host} is {addr}, a {class} address; webhook endpoints may not be {class} addresses{hint}"
    )]
    Refused {
        /// The URL's host.
        host: String,
        /// The address refused.
        addr: IpAddr,
        /// Its class (`loopback`, `private`, `link-local`, …).
        class: &'static str,
        /// What allows it, when a setting does.
        hint: &'static str,
    },
    /// The name does not resolve.
    #[error("the host {host} does not resolve: {reason}")]
    Unresolved {
        /// The URL's host.
        host: String,
        /// Why.
        reason: String,
    },
}

impl TargetRules {
    /// The class of `ip` if it is refused, with what would allow it.
    pub fn refused(&self, ip: IpAddr) -> Option<(&'static str, &'static str)> {
        let class = classify(ip)?;
        match class {
            "loopback" if self.allow_loopback => None,
            "loopback" => Some((class, " (unless [webhooks] allow_loopback = true)")),
            "private" if self.allow_private => None,
            "private" => Some((class, " (unless [webhooks] allow_private = true)")),
            other => Some((other, "")),
        }
    }

    /// Checks a URL being registered, resolving its host: `Ok` with the URL
    /// as it will be stored.
    pub async fn check_registration(&self, raw: &str) -> Result<String, TargetError> {
        let url = self.check_shape(raw)?;
        let host = url.host_str().unwrap_or_default().to_owned();
        if let Some(ip) = literal(&url) {
            self.check_ip(&host, ip)?;
            return Ok(url.to_string());
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let lookup = tokio::net::lookup_host((host.clone(), port));
        let addrs: Vec<SocketAddr> = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(e)) => {
                return Err(TargetError::Unresolved {
                    host,
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(TargetError::Unresolved {
                    host,
                    reason: format!("no answer within {} s", RESOLVE_TIMEOUT.as_secs()),
                })
            }
        };
        if addrs.is_empty() {
            return Err(TargetError::Unresolved {
                host,
                reason: "no address".into(),
            });
        }
        for addr in &addrs {
            self.check_ip(&host, addr.ip())?;
        }
        Ok(url.to_string())
    }

    /// The URL's shape (scheme, credentials, host), without resolving.
    pub fn check_shape(&self, raw: &str) -> Result<Url, TargetError> {
        let url = Url::parse(raw.trim()).map_err(|e| TargetError::Malformed {
            url: raw.to_owned(),
            reason: e.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(TargetError::Scheme(url.scheme().to_owned()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(TargetError::Credentials);
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(TargetError::NoHost);
        }
        Ok(url)
    }

    /// Checks a URL about to be sent to: its shape, and its host when it is
    /// an address (names are checked by [`Resolver`] as they resolve).
    pub fn check_before_sending(&self, raw: &str) -> Result<Url, TargetError> {
        let url = self.check_shape(raw)?;
        if let Some(ip) = literal(&url) {
            self.check_ip(url.host_str().unwrap_or_default(), ip)?;
        }
        Ok(url)
    }

    fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), TargetError> {
        match self.refused(ip) {
            None => Ok(()),
            Some((class, hint)) => Err(TargetError::Refused {
                host: host.to_owned(),
                addr: ip,
                class,
                hint,
            }),
        }
    }

    /// A resolver for the delivery client that keeps only allowed addresses.
    pub fn resolver(self) -> Arc<Resolver> {
        Arc::new(Resolver { rules: self })
    }
}

/// The URL's host as an address, if it is one.
fn literal(url: &Url) -> Option<IpAddr> {
    // `Url` writes an IPv6 host in brackets and an IPv4 one canonically.
    let host = url.host_str()?;
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    }
}

/// The class of an address endpoints may not have by default, `None` for a
/// public one.
fn classify(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return classify_v4(v4);
            }
            let seg = v6.segments();
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if seg[0] & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if seg[0] & 0xfe00 == 0xfc00 {
                Some("private")
            } else if seg[0] == 0x2001 && seg[1] == 0x0db8 {
                Some("reserved")
            } else if seg[0] == 0x0064 && seg[1] == 0xff9b {
                // NAT64: the IPv4 address it embeds decides.
                let [a, b] = seg[6].to_be_bytes();
                let [c, d] = seg[7].to_be_bytes();
                classify_v4(Ipv4Addr::new(a, b, c, d))
            } else {
                None
            }
        }
    }
}

fn classify_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = v4.octets();
    if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if v4.is_private() || (a == 100 && (64..128).contains(&b)) {
        Some("private")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_multicast() {
        Some("multicast")
    } else if v4.is_broadcast() {
        Some("broadcast")
    } else if v4.is_documentation() || a >= 240 || (a == 198 && (b == 18 || b == 19)) {
        Some("reserved")
    } else {
        None
    }
}

/// The delivery client's resolver: the system's, minus refused addresses.
#[derive(Debug)]
pub struct Resolver {
    rules: TargetRules,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match rules.refused(a.ip()) {
                    None => true,
                    Some((class, _)) => {
                        refused = Some((a.ip(), class));
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let message = match refused {
                    Some((ip, class)) => format!(
                        "{host} resolves to {ip}, a {class} address; webhook endpoints may not be {class} addresses"
                    ),
                    None => format!("{host} does not resolve"),
                };
                return Err(message.into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refused_addresses_are_named_and_settings_allow_what_they_say() {
        let strict = TargetRules::default();
        for (url, class) in [
            ("http://127.0.0.1:9/", "loopback"),
            ("http://[::1]/", "loopback"),
            ("http://localhost:9/", "loopback"),
            ("http://10.1.2.3/", "private"),
            ("http://192.168.0.10/", "private"),
            ("http://100.64.0.1/", "private"),
            ("http://[fd00::1]/", "private"),
            ("http://169.254.169.254/latest/meta-data", "link-local"),
            ("http://[fe80::1]/", "link-local"),
            ("http://0.0.0.0/", "unspecified"),
            ("http://224.0.0.1/", "multicast"),
            ("http://255.255.255.255/", "broadcast"),
            ("http://[::ffff:10.0.0.1]/", "private"),
            ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),
        ] {
            let err = strict.check_registration(url).await.unwrap_err();
            match &err {
                TargetError::Refused { class: c, .. } => assert_eq!(*c, class, "{url}: {err}"),
                other => panic!("{url}: {other}"),
            }
            assert!(err.to_string().contains(class), "{err}");
        }
        let loopback = TargetRules {
            allow_loopback: true,
            ..TargetRules::default()
        };
        assert!(loopback
            .check_registration("http://127.0.0.1:9/h")
            .await
            .is_ok());
        assert!(loopback
            .check_registration("http://10.0.0.1/")
            .await
            .is_err());
        assert!(loopback
            .check_registration("http://169.254.169.254/")
            .await
            .is_err());
        let private = TargetRules {
            allow_private: true,
            ..TargetRules::default()
        };
        assert!(private.check_registration("http://10.0.0.1/").await.is_ok());
        assert!(private
            .check_registration("http://127.0.0.1/")
            .await
            .is_err());
        assert!(strict
            .check_registration("https://93.184.215.14/hook")
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn only_http_urls_without_credentials() {
        let rules = TargetRules::default();
        for (url, want) in [
            ("ftp://example.com/", "only http and https"),
            ("http://user:pw@93.184.215.14/", "credentials"),
            ("not a url", "is not a URL"),
            ("file:///etc/passwd", "only http and https"),
        ] {
            let err = rules.check_registration(url).await.unwrap_err().to_string();
            assert!(err.contains(want), "{url}: {err}");
        }
    }
}
