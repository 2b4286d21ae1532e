//! The accounts layer of one platform: the base's `/etc/passwd` and `/etc/group` (read from
//! its layers as the glibc detection reads `libc.so.6`), with `[accounts]` appended, or
//! written fresh on `scratch`; each user's home directory owned by the user; and, when
//! `[image] user` and `workdir` are both set, the workdir owned by that user, so the
//! process can write where it starts.
//!
//! The base's lines are kept byte for byte and ours follow in the recipe's order. A name or
//! ID the base already has is refused, naming the recipe's entry and the base's line: two
//! entries for one name or ID leave which one wins to the reader.

use super::error::BuildError;
use crate::{
    layers::{LayerKind, OwnedEntry, OwnedLayer, owned::Content},
    oci::{
        accounts::{
            AccountFiles, AccountLine, UnknownAccount, account_lines, read_account_files,
            resolve_user,
        },
        base::BaseImage,
    },
    recipe::{Recipe, RecipeError, SourceSpan, accounts::Accounts},
};

/// Whether the image's account tables are needed: to add accounts, to own the user's
/// workdir, or to resolve a `[[files]]` owner.
pub(super) fn needs_tables(recipe: &Recipe) -> bool {
    !recipe.accounts.is_empty()
        || (recipe.config.user.is_some() && recipe.config.workdir.is_some())
        || recipe.files.iter().any(|copy| copy.owner.is_some())
}

/// The names `[image] user` and `[[files]] owner` use, looked up in the merged `tables` (of
/// a recipe that [`needs_tables`]) as the stage will: a name the image lacks fails here,
/// before the solve and the install, and not after them.
pub(super) fn check_names(recipe: &Recipe, tables: Option<&Merged>) -> Result<(), BuildError> {
    let Some(tables) = tables else {
        return Ok(());
    };
    accounts_layer(recipe, tables, 0)?;
    for (owner, span) in recipe.files.iter().filter_map(|copy| copy.owner.as_ref()) {
        resolve(recipe, "`owner`", owner, Some(span), tables)?;
    }
    Ok(())
}

/// The image's `/etc/passwd` and `/etc/group`: the base's with `[accounts]` merged in.
pub(super) fn account_tables(
    recipe: &Recipe,
    base: Option<&BaseImage>,
) -> Result<Merged, BuildError> {
    let files = match base {
        Some(base) => read_account_files(base)?,
        None => AccountFiles::default(),
    };
    merge(recipe, &recipe.accounts, &files)
}

/// The accounts layer of `recipe` with its merged `tables`, or `None` when the recipe adds
/// no accounts and does not set both `user` and `workdir`.
pub(super) fn accounts_layer(
    recipe: &Recipe,
    tables: &Merged,
    mtime: u64,
) -> Result<Option<OwnedLayer>, BuildError> {
    let accounts = &recipe.accounts;
    let workdir = recipe
        .config
        .workdir
        .as_ref()
        .filter(|_| recipe.config.user.is_some());
    if accounts.is_empty() && workdir.is_none() {
        return Ok(None);
    }
    let mut entries = Vec::new();
    if !accounts.users.is_empty() {
        entries.push(account_file("etc/passwd", &tables.passwd));
    }
    if !accounts.groups.is_empty() {
        entries.push(account_file("etc/group", &tables.group));
    }
    for user in &accounts.users {
        if let Some(home) = in_image(&user.home) {
            entries.push(owned_directory(home, user.uid, user.gid));
        }
    }
    // The user is looked up whenever this layer is made, so a name `[image] user` gives
    // is one the image has.
    let owner = recipe
        .config
        .user
        .as_ref()
        .map(|user| resolve(recipe, "`[image] user`", user, None, tables))
        .transpose()?;
    if let (Some((uid, gid)), Some(dir)) = (owner, workdir.and_then(|w| in_image(w))) {
        entries.push(owned_directory(dir, uid, gid));
    }
    Ok(Some(OwnedLayer::new(
        LayerKind::Accounts,
        "accounts".to_string(),
        entries,
        mtime,
    )))
}

/// `/etc/passwd` and `/etc/group` with the recipe's accounts in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Merged {
    passwd: String,
    group: String,
}

/// The base's files with the recipe's entries appended. A file the base lacks (`scratch`,
/// busybox) starts with `root` (unless the recipe names root or ID 0 itself), as every
/// image with accounts has it.
fn merge(recipe: &Recipe, accounts: &Accounts, files: &AccountFiles) -> Result<Merged, BuildError> {
    let base_passwd = match &files.passwd {
        Some(text) => with_newline(text),
        None if accounts
            .users
            .iter()
            .any(|u| u.uid == 0 || u.name == "root") =>
        {
            String::new()
        }
        None => "root:x:0:0:root:/root:/bin/sh\n".to_string(),
    };
    let base_group = match &files.group {
        Some(text) => with_newline(text),
        None if accounts
            .groups
            .iter()
            .any(|g| g.gid == 0 || g.name == "root") =>
        {
            String::new()
        }
        None => "root:x:0:\n".to_string(),
    };
    let mut group = base_group.clone();
    let theirs = account_lines(&base_group);
    for ours in &accounts.groups {
        if let Some(line) = theirs
            .iter()
            .find(|l| l.name == ours.name || l.id == ours.gid)
        {
            let what = ("group", ours.name.as_str(), ours.gid, "/etc/group");
            return Err(clash(recipe, &ours.span, what, line));
        }
        group.push_str(&format!("{}:x:{}:\n", ours.name, ours.gid));
    }
    let mut passwd = base_passwd.clone();
    let (theirs, groups) = (account_lines(&base_passwd), account_lines(&group));
    for ours in &accounts.users {
        if let Some(line) = theirs
            .iter()
            .find(|l| l.name == ours.name || l.id == ours.uid)
        {
            let what = ("user", ours.name.as_str(), ours.uid, "/etc/passwd");
            return Err(clash(recipe, &ours.span, what, line));
        }
        if !groups.iter().any(|g| g.id == ours.gid) {
            return Err(invalid(
                recipe,
                Some(&ours.gid_span),
                format!(
                    "user `{}` has gid {}, which no group of `[accounts]` or of the base's /etc/group has",
                    ours.name, ours.gid
                ),
            ));
        }
        passwd.push_str(&format!(
            "{}:x:{}:{}::{}:{}\n",
            ours.name, ours.uid, ours.gid, ours.home, ours.shell
        ));
    }
    Ok(Merged { passwd, group })
}

fn with_newline(text: &str) -> String {
    let mut text = text.to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// A recipe entry (`what`: kind, name, ID, file) that has the name or ID of the base's
/// `line`.
fn clash(
    recipe: &Recipe,
    span: &SourceSpan,
    (kind, name, id, file): (&str, &str, u32, &str),
    line: &AccountLine<'_>,
) -> BuildError {
    let same = if line.name == name { "name" } else { "ID" };
    invalid(
        recipe,
        Some(span),
        format!(
            "{kind} `{name}` ({id}) has the {same} of the base's {file} line `{}`: choose another name and ID, or leave the base's entry alone",
            line.text
        ),
    )
}

fn invalid(recipe: &Recipe, span: Option<&SourceSpan>, message: String) -> BuildError {
    BuildError::Recipe(RecipeError::Invalid {
        path: recipe.path.clone(),
        message,
        span: span.cloned(),
    })
}

/// The uid and gid `spec` (`uid`, `uid:gid`, `name`, `name:group`; `what` says whose, at
/// `span`) stands for in the merged `tables`. A name neither file has is an error: the
/// runtime would refuse to start, or the files would belong to nobody.
pub(super) fn resolve(
    recipe: &Recipe,
    what: &str,
    spec: &str,
    span: Option<&SourceSpan>,
    tables: &Merged,
) -> Result<(u32, u32), BuildError> {
    resolve_user(&tables.passwd, &tables.group, spec).map_err(|unknown| {
        let UnknownAccount { kind, name, file } = unknown;
        invalid(
            recipe,
            span,
            format!(
                "{what} names the {kind} `{name}`, which neither `[accounts]` nor the base's {file} has"
            ),
        )
    })
}

/// An absolute in-image path as a layer entry's path; `None` for `/` itself.
fn in_image(path: &str) -> Option<&str> {
    Some(path.trim_matches('/')).filter(|p| !p.is_empty())
}

fn account_file(path: &str, text: &str) -> OwnedEntry {
    OwnedEntry {
        path: path.to_string(),
        uid: 0,
        gid: 0,
        mode: 0o644,
        content: Content::Bytes(text.as_bytes().to_vec()),
    }
}

fn owned_directory(path: &str, uid: u32, gid: u32) -> OwnedEntry {
    OwnedEntry {
        path: path.to_string(),
        uid,
        gid,
        mode: 0o755,
        content: Content::Directory,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::recipe::RecipeOptions;

    fn recipe(text: &str) -> Recipe {
        Recipe::from_str_at(
            &format!("[image]\nname = \"x\"\n{text}\n"),
            Path::new("r.toml"),
            &RecipeOptions::default(),
        )
        .unwrap()
    }

    const JOVYAN: &str = "[[accounts.groups]]\nname = \"jovyan\"\ngid = 1000\n\
        [[accounts.users]]\nname = \"jovyan\"\nuid = 1000\ngid = 1000\n";

    fn base_files() -> AccountFiles {
        AccountFiles {
            passwd: Some(
                "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1001:1001::/home/ubuntu:/bin/bash"
                    .into(),
            ),
            group: Some("root:x:0:\nubuntu:x:1001:\n".into()),
        }
    }

    #[test]
    fn the_recipes_accounts_follow_the_bases_lines_or_root_on_scratch() {
        let recipe = recipe(JOVYAN);
        let merged = merge(&recipe, &recipe.accounts, &base_files()).unwrap();
        assert_eq!(
            merged.passwd,
            "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1001:1001::/home/ubuntu:/bin/bash\n\
             jovyan:x:1000:1000::/home/jovyan:/bin/sh\n"
        );
        assert_eq!(merged.group, "root:x:0:\nubuntu:x:1001:\njovyan:x:1000:\n");
        let fresh = merge(&recipe, &recipe.accounts, &AccountFiles::default()).unwrap();
        assert_eq!(
            fresh.passwd,
            "root:x:0:0:root:/root:/bin/sh\njovyan:x:1000:1000::/home/jovyan:/bin/sh\n"
        );
        assert_eq!(fresh.group, "root:x:0:\njovyan:x:1000:\n");
    }

    #[test]
    fn a_clash_with_the_base_names_both_and_a_missing_group_its_gid() {
        for (text, needle) in [
            (
                JOVYAN.replace("uid = 1000", "uid = 1001"),
                "user `jovyan` (1001) has the ID of the base's /etc/passwd line `ubuntu:x:1001:1001::/home/ubuntu:/bin/bash`",
            ),
            (
                JOVYAN.replace("name = \"jovyan\"\nuid", "name = \"ubuntu\"\nuid"),
                "user `ubuntu` (1000) has the name of the base's /etc/passwd line",
            ),
            (
                JOVYAN.replace("gid = 1000\n[[", "gid = 1001\n[["),
                "group `jovyan` (1001) has the ID of the base's /etc/group line `ubuntu:x:1001:`",
            ),
            (
                JOVYAN.replace("uid = 1000\ngid = 1000", "uid = 1000\ngid = 7"),
                "user `jovyan` has gid 7, which no group",
            ),
        ] {
            let recipe = recipe(&text);
            let err = merge(&recipe, &recipe.accounts, &base_files()).unwrap_err();
            let err = err.to_string();
            assert!(err.contains(needle), "{err}");
            assert!(err.contains("r.toml:"), "{err}");
        }
    }

    fn layer_of(recipe: &Recipe) -> Result<Option<OwnedLayer>, BuildError> {
        accounts_layer(recipe, &account_tables(recipe, None)?, 7)
    }

    #[test]
    fn homes_and_the_workdir_are_owned_by_their_user() {
        let recipe = recipe(&format!(
            "user = \"jovyan\"\nworkdir = \"/home/jovyan/work\"\n{JOVYAN}"
        ));
        let layer = layer_of(&recipe).unwrap().unwrap();
        let owners: Vec<(&str, u32, u32)> = layer
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.uid, e.gid))
            .collect();
        assert_eq!(
            owners,
            [
                ("etc", 0, 0),
                ("etc/group", 0, 0),
                ("etc/passwd", 0, 0),
                ("home", 0, 0),
                ("home/jovyan", 1000, 1000),
                ("home/jovyan/work", 1000, 1000),
            ]
        );
        // A numeric user needs no account; a name must have one.
        let numeric = self::recipe("user = \"1000:100\"\nworkdir = \"/work\"");
        let layer = layer_of(&numeric).unwrap().unwrap();
        assert_eq!((layer.entries[0].uid, layer.entries[0].gid), (1000, 100));
        let unknown = self::recipe(&format!("user = \"nobody\"\nworkdir = \"/w\"\n{JOVYAN}"));
        let err = layer_of(&unknown).unwrap_err().to_string();
        assert!(
            err.contains("`[image] user` names the user `nobody`"),
            "{err}"
        );
        // With [accounts], a name is checked even without a workdir.
        let no_workdir = self::recipe(&format!("user = \"nobody\"\n{JOVYAN}"));
        assert!(layer_of(&no_workdir).is_err());
        let named = self::recipe(&format!("user = \"jovyan\"\n{JOVYAN}"));
        assert!(layer_of(&named).is_ok());
        assert!(
            layer_of(&self::recipe("user = \"1000\""))
                .unwrap()
                .is_none()
        );
    }
}
