//! Where a registry's token realm may send us, and whether the user's credentials go along.
//!
//! A `WWW-Authenticate: Bearer realm="…"` challenge names any URL it likes. containerd's
//! docker authorizer (`core/remotes/docker/authorizer.go`, `auth/fetch.go`: credentials
//! looked up by the registry's host, then sent to `to.Realm` as a Basic header or an OAuth
//! form) and containers/image (`docker/docker_client.go`, `getBearerToken`:
//! `authReq.SetBasicAuth` on the realm URL) send the password to whatever realm the
//! challenge names, over whatever scheme it names. imgbuild does not:
//! - the realm must be HTTPS; plain HTTP only when the registry itself is reached over plain
//!   HTTP on loopback (`--insecure`) and the realm is on loopback too;
//! - the user's credentials (stored for the registry's host) go only to that host, on any
//!   port, or to the one realm host a well-known registry is documented to use
//!   ([`KNOWN_REALM_HOSTS`]); a realm on another host is asked for an anonymous token.

/// Registries whose token service lives on another host of the same operator: the
/// registry's API host and its realm's host.
pub(crate) const KNOWN_REALM_HOSTS: &[(&str, &str)] = &[
    // Docker Hub: https://auth.docker.io/token.
    ("registry-1.docker.io", "auth.docker.io"),
    // GitLab.com's registry: https://gitlab.com/jwt/auth.
    ("registry.gitlab.com", "gitlab.com"),
];

/// What may be asked of a realm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Realm {
    pub url: url::Url,
    /// Whether the token request may carry the user's credentials.
    pub credentials: bool,
}

/// Why a realm is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RealmRefusal {
    /// Not a URL, or no host.
    Invalid,
    /// Not HTTPS (and not the loopback exception).
    NotHttps,
}

/// Whether `host` is this machine: `localhost`, `127.0.0.0/8`, `::1`.
fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// Judges `realm` for a registry reached at `registry` (the API's origin, e.g.
/// `https://ghcr.io`).
pub(crate) fn judge(registry: &url::Url, realm: &str) -> Result<Realm, RealmRefusal> {
    let url = url::Url::parse(realm).map_err(|_| RealmRefusal::Invalid)?;
    let registry_host = registry.host().ok_or(RealmRefusal::Invalid)?;
    let loopback_http = url.scheme() == "http"
        && registry.scheme() == "http"
        && is_loopback(&registry_host)
        && url.host().is_some_and(|host| is_loopback(&host));
    if url.scheme() != "https" && !loopback_http {
        return Err(RealmRefusal::NotHttps);
    }
    let host = url.host().ok_or(RealmRefusal::Invalid)?;
    let realm_host = host.to_string().to_ascii_lowercase();
    let own_host = registry_host.to_string().to_ascii_lowercase();
    let credentials = realm_host == own_host
        || KNOWN_REALM_HOSTS
            .iter()
            .any(|(api, realm)| *api == own_host && *realm == realm_host);
    Ok(Realm { url, credentials })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(registry: &str, realm: &str) -> Result<bool, RealmRefusal> {
        judge(&url::Url::parse(registry).unwrap(), realm).map(|r| r.credentials)
    }

    #[test]
    fn https_realms_get_credentials_only_on_the_registry_host() {
        assert_eq!(judged("https://ghcr.io", "https://ghcr.io/token"), Ok(true));
        assert_eq!(
            judged("https://ghcr.io", "https://GHCR.io:8443/t"),
            Ok(true)
        );
        assert_eq!(
            judged("https://ghcr.io", "https://evil.example/t"),
            Ok(false)
        );
        assert_eq!(
            judged(
                "https://registry-1.docker.io",
                "https://auth.docker.io/token"
            ),
            Ok(true)
        );
        assert_eq!(
            judged("https://registry.gitlab.com", "https://gitlab.com/jwt/auth"),
            Ok(true)
        );
        assert_eq!(
            judged("https://gitlab.com", "https://registry.gitlab.com/jwt"),
            Ok(false)
        );
    }

    #[test]
    fn plain_http_realms_only_between_loopback_ends() {
        assert_eq!(
            judged("https://ghcr.io", "http://ghcr.io/token"),
            Err(RealmRefusal::NotHttps)
        );
        assert_eq!(
            judged("https://127.0.0.1:5000", "http://127.0.0.1:1/t"),
            Err(RealmRefusal::NotHttps)
        );
        assert_eq!(
            judged("http://127.0.0.1:5000", "http://127.0.0.1:1/t"),
            Ok(true)
        );
        assert_eq!(
            judged("http://127.0.0.1:5000", "http://127.0.0.2:1/t"),
            Ok(false)
        );
        assert_eq!(
            judged("http://127.0.0.1:5000", "http://10.0.0.1/t"),
            Err(RealmRefusal::NotHttps)
        );
        assert_eq!(
            judged("https://ghcr.io", "file:///etc/passwd"),
            Err(RealmRefusal::NotHttps)
        );
        assert_eq!(
            judged("https://ghcr.io", "token"),
            Err(RealmRefusal::Invalid)
        );
    }
}
