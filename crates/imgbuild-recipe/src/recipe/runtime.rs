//! The `[image]` keys only the container runtime reads: the ports the image exposes and the
//! signal that stops it. Both are checked here, at the value, because a runtime meets a bad
//! one only when a container starts (or, for the stop signal, when it is being stopped).

use std::collections::BTreeSet;

use toml::Spanned;

use super::{checker::Checker, error::RecipeError};

/// The protocols an OCI config's `ExposedPorts` key may name.
const PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

/// Linux's signal names (with `SIG`), as `kill -l` lists them, plus the aliases Go's and
/// runc's tables accept (`SIGIOT`, `SIGPOLL`).
const SIGNALS: [&str; 33] = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGIOT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPOLL",
    "SIGPWR",
    "SIGSYS",
];

/// Real-time signals run from `SIGRTMIN` (34 on Linux) to `SIGRTMAX` (64): 30 steps apart.
const REALTIME_SPAN: u32 = 30;

/// The highest signal number on Linux.
const MAX_SIGNAL: u32 = 64;

impl Checker {
    /// `[image] ports`: each `N` or `N/PROTOCOL` with N in 1..=65535, written as the config
    /// keys them (`8888/tcp`; a bare number is TCP, as the OCI spec says), sorted; a port
    /// given twice is an error at its second mention.
    pub(super) fn ports(&self, ports: &[Spanned<String>]) -> Result<Vec<String>, RecipeError> {
        let mut seen = BTreeSet::new();
        for port in ports {
            let key = self.port(port)?;
            if !seen.insert(key.clone()) {
                return Err(self.error(port, format!("port `{key}` is listed twice")));
            }
        }
        Ok(seen.into_iter().collect())
    }

    fn port(&self, port: &Spanned<String>) -> Result<String, RecipeError> {
        let raw = port.get_ref();
        let (number, protocol) = raw.split_once('/').unwrap_or((raw, "tcp"));
        if !PROTOCOLS.contains(&protocol) {
            return Err(self.error(
                port,
                format!("port `{raw}` has protocol `{protocol}`: expected `tcp`, `udp` or `sctp`"),
            ));
        }
        let valid = !number.is_empty()
            && number.len() <= 5
            && number.bytes().all(|b| b.is_ascii_digit())
            && matches!(number.parse::<u32>(), Ok(1..=65535));
        if !valid {
            return Err(self.error(
                port,
                format!(
                    "port `{raw}` is not a port number: expected `N`, `N/tcp`, `N/udp` or `N/sctp` with N in 1..=65535"
                ),
            ));
        }
        // Leading zeros would make `080/tcp` and `80/tcp` two keys for one port.
        Ok(format!(
            "{}/{protocol}",
            number.parse::<u32>().expect("checked digits")
        ))
    }

    /// `[image] stop-signal`: a signal name as the OCI config writes it (`SIGTERM`,
    /// `SIGRTMIN+3`, `SIGRTMAX-1`) or a signal number (1..=64), kept as written.
    pub(super) fn stop_signal(&self, signal: &Spanned<String>) -> Result<String, RecipeError> {
        let raw = signal.get_ref();
        if is_signal(raw) {
            return Ok(raw.clone());
        }
        let upper = raw.to_ascii_uppercase();
        let hint = [upper.clone(), format!("SIG{upper}")]
            .into_iter()
            .find(|name| is_signal(name))
            .map(|name| format!(": write `{name}`"))
            .unwrap_or_else(|| {
                ": expected a name such as `SIGTERM` or `SIGRTMIN+3`, or a number in 1..=64"
                    .to_string()
            });
        Err(self.error(
            signal,
            format!("`stop-signal` `{raw}` is not a signal{hint}"),
        ))
    }
}

/// Whether `text` is a signal as the OCI config's `StopSignal` holds it.
fn is_signal(text: &str) -> bool {
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.len() <= 2 && matches!(text.parse::<u32>(), Ok(1..=MAX_SIGNAL));
    }
    if SIGNALS.contains(&text) {
        return true;
    }
    let offset = |rest: &str| {
        !rest.is_empty()
            && rest.len() <= 2
            && rest.bytes().all(|b| b.is_ascii_digit())
            && matches!(rest.parse::<u32>(), Ok(1..=REALTIME_SPAN))
    };
    match (text.strip_prefix("SIGRTMIN"), text.strip_prefix("SIGRTMAX")) {
        (Some(rest), _) => rest.is_empty() || rest.strip_prefix('+').is_some_and(offset),
        (_, Some(rest)) => rest.is_empty() || rest.strip_prefix('-').is_some_and(offset),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::recipe::{Recipe, RecipeOptions};

    fn image(lines: &str) -> Result<Recipe, String> {
        let text = format!("[image]\nname = \"x\"\n{lines}\n");
        Recipe::from_str_at(&text, Path::new("r.toml"), &RecipeOptions::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn ports_are_keyed_as_the_config_keys_them_and_sorted() {
        let recipe = image("ports = [\"9000/udp\", \"8888\", \"0080/tcp\", \"132/sctp\"]").unwrap();
        assert_eq!(
            recipe.config.ports,
            ["132/sctp", "80/tcp", "8888/tcp", "9000/udp"]
        );
        assert!(image("").unwrap().config.ports.is_empty());
    }

    #[test]
    fn bad_ports_are_refused_at_the_value() {
        for (port, needle) in [
            ("0", "not a port number"),
            ("65536/tcp", "not a port number"),
            ("http", "not a port number"),
            ("-1", "not a port number"),
            ("", "not a port number"),
            ("8080/icmp", "protocol `icmp`"),
            ("8080/TCP", "protocol `TCP`"),
            ("8080/tcp/tcp", "protocol `tcp/tcp`"),
        ] {
            let err = image(&format!("ports = [\"22\", \"{port}\"]")).unwrap_err();
            assert!(err.contains(needle), "{port}: {err}");
            assert!(err.contains("r.toml:3:"), "{port}: {err}");
        }
        let err = image("ports = [\"80\", \"80/tcp\"]").unwrap_err();
        assert!(err.contains("port `80/tcp` is listed twice"), "{err}");
    }

    #[test]
    fn stop_signals_are_names_or_numbers() {
        for signal in [
            "SIGTERM",
            "SIGINT",
            "SIGRTMIN",
            "SIGRTMIN+3",
            "SIGRTMAX-30",
            "9",
            "64",
        ] {
            let recipe = image(&format!("stop-signal = \"{signal}\"")).unwrap();
            assert_eq!(recipe.config.stop_signal.as_deref(), Some(signal));
        }
        for (signal, needle) in [
            ("TERM", "write `SIGTERM`"),
            ("sigquit", "write `SIGQUIT`"),
            ("SIGNOPE", "expected a name such as"),
            ("0", "expected a name"),
            ("65", "expected a name"),
            ("SIGRTMIN+31", "expected a name"),
            ("SIGRTMAX+1", "expected a name"),
            ("SIGRTMIN+", "expected a name"),
        ] {
            let err = image(&format!("stop-signal = \"{signal}\"")).unwrap_err();
            assert!(err.contains(needle), "{signal}: {err}");
            assert!(err.contains("r.toml:3:"), "{signal}: {err}");
        }
    }
}
