//! An image's own `/etc/passwd` and `/etc/group`, as its layers leave them for the container:
//! what the build merges `[accounts]` into, and what `k8s` resolves a named user through.

use crate::{
    compression::bounded::{Bound, read_to_end_bounded},
    oci::base::{BaseImage, GlibcError},
};

/// The most bytes of an image's `/etc/passwd` or `/etc/group` that are read: a real one has
/// a few kilobytes.
const MAX_ACCOUNT_FILE: u64 = 4 << 20;

/// The account files, as the container would see them; `None` where the image has none.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AccountFiles {
    pub passwd: Option<String>,
    pub group: Option<String>,
}

/// One line of `/etc/passwd` or `/etc/group`: its name, ID and (passwd) primary gid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountLine<'a> {
    pub text: &'a str,
    pub name: &'a str,
    pub id: u32,
    pub gid: Option<u32>,
}

/// The parsed lines of an account file; comments and malformed lines are kept in the text
/// but name nothing.
pub fn account_lines(text: &str) -> Vec<AccountLine<'_>> {
    text.lines()
        .filter_map(|text| {
            let mut fields = text.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            let gid = fields.next().and_then(|g| g.parse().ok());
            (!name.is_empty() && !name.starts_with('#')).then_some(AccountLine {
                text,
                name,
                id,
                gid,
            })
        })
        .collect()
}

/// `/etc/passwd` and `/etc/group` of `image`: the last layer's copy wins, and a whiteout
/// (`etc/.wh.passwd`, an opaque `etc`, a removed `etc`) removes what the layers below held.
/// A link or anything but a file there is refused: merging into it would write through it,
/// and reading through it would read another file than the container's.
pub fn read_account_files(image: &BaseImage) -> Result<AccountFiles, GlibcError> {
    let mut files = AccountFiles::default();
    let layer_error = |digest, source| GlibcError::Layer { digest, source };
    image.walk_layers(layer_error, |digest, path, entry| {
        let path = path.trim_start_matches("./").trim_start_matches('/');
        let slot = match path.trim_end_matches('/') {
            "etc/passwd" | "etc/.wh.passwd" => &mut files.passwd,
            "etc/group" | "etc/.wh.group" => &mut files.group,
            "etc/.wh..wh..opq" | ".wh.etc" => {
                files = AccountFiles::default();
                return Ok(());
            }
            _ => return Ok(()),
        };
        if path.contains(".wh.") {
            *slot = None;
            return Ok(());
        }
        if !entry.header().entry_type().is_file() {
            return Err(layer_error(
                digest.to_string(),
                std::io::Error::other(format!(
                    "`/{path}` is not a regular file in the image (a link or another kind); imgbuild reads accounts only from a plain file"
                )),
            ));
        }
        let bound = Bound::new(
            MAX_ACCOUNT_FILE,
            format!("`/{path}` in layer `{digest}`"),
            "the most an account file may hold",
        );
        let bytes = read_to_end_bounded(entry, bound)
            .map_err(|source| layer_error(digest.to_string(), source))?;
        *slot = Some(String::from_utf8_lossy(&bytes).into_owned());
        Ok(())
    })?;
    Ok(files)
}

/// A name [`resolve_user`] found in neither file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAccount {
    /// `user` or `group`.
    pub kind: &'static str,
    pub name: String,
    /// `/etc/passwd` or `/etc/group`.
    pub file: &'static str,
}

/// The uid and gid `user` (`NAME`, `UID`, `NAME:GROUP`, `UID:GID`, as an image config's
/// `User` is written) stands for in the `passwd` and `group` texts. A user without a group
/// gets its primary gid (0 for a bare uid the file lacks).
pub fn resolve_user(passwd: &str, group: &str, user: &str) -> Result<(u32, u32), UnknownAccount> {
    let (users, groups) = (account_lines(passwd), account_lines(group));
    let (name, group) = match user.split_once(':') {
        Some((name, group)) => (name, Some(group)),
        None => (user, None),
    };
    let unknown = |kind, name: &str, file| UnknownAccount {
        kind,
        name: name.to_string(),
        file,
    };
    let entry = users
        .iter()
        .find(|l| l.name == name || name.parse() == Ok(l.id));
    let uid = match (name.parse::<u32>(), entry) {
        (Ok(uid), _) => uid,
        (Err(_), Some(entry)) => entry.id,
        (Err(_), None) => return Err(unknown("user", name, "/etc/passwd")),
    };
    let gid = match group {
        None => entry.and_then(|e| e.gid).unwrap_or(0),
        Some(group) => match (
            group.parse::<u32>(),
            groups.iter().find(|g| g.name == group),
        ) {
            (Ok(gid), _) => gid,
            (Err(_), Some(entry)) => entry.id,
            (Err(_), None) => return Err(unknown("group", group, "/etc/group")),
        },
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_through_the_files() {
        let passwd = "root:x:0:0::/root:/bin/sh\njovyan:x:1000:100::/home/jovyan:/bin/sh\n";
        let group = "root:x:0:\nusers:x:100:\nstaff:x:50:\n";
        let resolve = |user| resolve_user(passwd, group, user);
        assert_eq!(resolve("jovyan").unwrap(), (1000, 100));
        assert_eq!(resolve("jovyan:staff").unwrap(), (1000, 50));
        assert_eq!(resolve("1000:7").unwrap(), (1000, 7));
        assert_eq!(resolve("1000").unwrap(), (1000, 100));
        assert_eq!(resolve("nobody").unwrap_err().name, "nobody");
        assert_eq!(resolve("jovyan:wheel").unwrap_err().file, "/etc/group");
        assert!(resolve_user("", "", "jovyan").is_err());
    }
}
