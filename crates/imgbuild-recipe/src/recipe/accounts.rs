//! `[accounts]`: the users and groups a recipe adds to the image, checked. What only the
//! base can say (a name or ID it already has, the group a user's gid names) is checked when
//! the base is read, at the same spans, so those errors point at the recipe too.

use std::collections::BTreeMap;

use toml::Spanned;

use super::{
    checker::{Checker, MAX_ID, UserPart, user_part},
    error::{RecipeError, SourceSpan},
    schema::{AccountsSection, GroupEntry, UserEntry},
};

/// `[accounts]`, checked: valid names and IDs, each name and each ID once.
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    /// In the recipe's order, which is their order in `/etc/group`.
    pub groups: Vec<Group>,
    /// In the recipe's order, which is their order in `/etc/passwd`.
    pub users: Vec<User>,
}

impl Accounts {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.users.is_empty()
    }
}

/// One `[[accounts.groups]]` entry.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub gid: u32,
    /// The entry in the recipe, for errors found against the base.
    pub span: SourceSpan,
}

/// One `[[accounts.users]]` entry.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Absolute, without `..`; default `/home/<name>`.
    pub home: String,
    /// Default `/bin/sh`.
    pub shell: String,
    /// The entry in the recipe, for errors found against the base.
    pub span: SourceSpan,
    /// The `gid` value, for a gid that names no group.
    pub gid_span: SourceSpan,
}

/// The shell of a user whose entry names none.
pub(crate) const DEFAULT_SHELL: &str = "/bin/sh";

impl Checker {
    /// `[accounts]`: groups, then users. `prefix` is the conda prefix, which no home may
    /// take ([`owned_directory_problem`]).
    pub(super) fn accounts(
        &self,
        section: &AccountsSection,
        prefix: &str,
    ) -> Result<Accounts, RecipeError> {
        let mut names = BTreeMap::new();
        let mut gids = BTreeMap::new();
        let mut groups = Vec::with_capacity(section.groups.len());
        for entry in &section.groups {
            let group = self.group(entry)?;
            self.once(&mut names, &entry.get_ref().name, "group name")?;
            self.once(&mut gids, &entry.get_ref().gid, "gid")?;
            groups.push(group);
        }
        let (mut names, mut uids) = (BTreeMap::new(), BTreeMap::new());
        let mut users = Vec::with_capacity(section.users.len());
        for entry in &section.users {
            let user = self.account_user(entry, prefix)?;
            self.once(&mut names, &entry.get_ref().name, "user name")?;
            self.once(&mut uids, &entry.get_ref().uid, "uid")?;
            users.push(user);
        }
        Ok(Accounts { groups, users })
    }

    /// Refuses a value `seen` already holds, naming the line of the first.
    fn once<T: Ord + Clone + std::fmt::Display>(
        &self,
        seen: &mut BTreeMap<T, usize>,
        value: &Spanned<T>,
        what: &str,
    ) -> Result<(), RecipeError> {
        let (line, _) = self.span(value.span()).line_column();
        if let Some(first) = seen.insert(value.get_ref().clone(), line) {
            return Err(self.error(
                value,
                format!(
                    "{what} `{}` is given twice in `[accounts]` (first on line {first})",
                    value.get_ref()
                ),
            ));
        }
        Ok(())
    }

    fn group(&self, entry: &Spanned<GroupEntry>) -> Result<Group, RecipeError> {
        let group = entry.get_ref();
        Ok(Group {
            name: self.account_name(&group.name, "group")?,
            gid: self.id(&group.gid, "gid")?,
            span: self.span(entry.span()),
        })
    }

    fn account_user(&self, entry: &Spanned<UserEntry>, prefix: &str) -> Result<User, RecipeError> {
        let user = entry.get_ref();
        let name = self.account_name(&user.name, "user")?;
        let uid = self.id(&user.uid, "uid")?;
        // One root: uid 0 is the name `root`'s alone, and `root` is uid 0.
        if (uid == 0) != (name == "root") {
            let message = format!(
                "user `{name}` has uid {uid}: uid 0 is root's, and only the account named `root` may have it (a second uid-0 account is a second root under another name)"
            );
            return Err(if uid == 0 {
                self.error(&user.uid, message)
            } else {
                self.error(&user.name, message)
            });
        }
        let home = match &user.home {
            Some(home) => {
                let path = self.account_path(home, "home")?;
                self.owned_directory(home, &path, "home", prefix, uid == 0)?;
                path
            }
            None => format!("/home/{name}"),
        };
        let shell = match &user.shell {
            Some(shell) => self.account_path(shell, "shell")?,
            None => DEFAULT_SHELL.to_string(),
        };
        Ok(User {
            uid,
            gid: self.id(&user.gid, "gid")?,
            name,
            home,
            shell,
            span: self.span(entry.span()),
            gid_span: self.span(user.gid.span()),
        })
    }

    /// A name as `useradd` accepts it: `[a-z_][a-z0-9_-]*[$]?`, at most 32 characters.
    fn account_name(&self, name: &Spanned<String>, what: &str) -> Result<String, RecipeError> {
        let raw = name.get_ref();
        if !matches!(user_part(raw), UserPart::Name) || raw.len() > 32 {
            return Err(self.error(
                name,
                format!(
                    "{what} name `{raw}` is not a name useradd accepts: [a-z_][a-z0-9_-]*[$]?, at most 32 characters"
                ),
            ));
        }
        Ok(raw.clone())
    }

    fn id(&self, id: &Spanned<i64>, what: &str) -> Result<u32, RecipeError> {
        match u32::try_from(*id.get_ref()) {
            Ok(value) if u64::from(value) <= MAX_ID => Ok(value),
            _ => Err(self.error(
                id,
                format!(
                    "{what} {} is outside 0..{MAX_ID} (the IDs Linux can give)",
                    id.get_ref()
                ),
            )),
        }
    }

    /// `home` or `shell`: absolute, without `..`, and without `:` or anything hidden, which
    /// would split or disguise the `/etc/passwd` line.
    fn account_path(&self, path: &Spanned<String>, what: &str) -> Result<String, RecipeError> {
        self.visible_only(path, &format!("`{what}`"))?;
        let raw = path.get_ref();
        if !raw.starts_with('/') || raw.split('/').any(|part| part == "..") || raw.contains(':') {
            return Err(self.error(
                path,
                format!("`{what}` `{raw}` must be an absolute path without `..` or `:`"),
            ));
        }
        Ok(normal_path(raw))
    }

    /// Refuses `path` (the value `at`, normalized) as a directory the build gives to a user
    /// (`what`: a home, or the workdir of `[image] user`) where [`owned_directory_problem`]
    /// finds one.
    pub(super) fn owned_directory(
        &self,
        at: &Spanned<String>,
        path: &str,
        what: &str,
        prefix: &str,
        root: bool,
    ) -> Result<(), RecipeError> {
        match owned_directory_problem(&normal_path(path), prefix, root) {
            None => Ok(()),
            Some(problem) => Err(self.error(
                at,
                format!(
                    "`{what}` `{path}` is {problem}: the build would make it a directory owned by the user; give a directory of its own, e.g. under /home"
                ),
            )),
        }
    }
}

/// The base's system trees: a directory the build gives to a user is never one of them or
/// beneath one (owning `/etc` is owning `/etc/passwd`; a home at `/etc/passwd` would replace
/// the file with a directory).
const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var",
];

/// The directories that hold other users' and services' directories: beneath them is where
/// a user's directory goes, but whoever owns one of them can rename what it holds.
const SHARED_PARENTS: &[&str] = &["/home", "/media", "/mnt", "/opt", "/srv", "/tmp"];

/// Why the normalized absolute `path` cannot be a directory the build makes and gives to a
/// user, if it cannot. The rule: a user's directory is a directory of its own, so not `/`,
/// not a system tree or anything in one, not a shared parent itself, not the conda `prefix`,
/// anything in it or a directory that holds it (whose owner could swap the environment),
/// and not `/root` or anything in it unless the user is `root` (`root` is true).
pub(crate) fn owned_directory_problem(path: &str, prefix: &str, root: bool) -> Option<String> {
    let within = |inner: &str, outer: &str| {
        outer == "/"
            || inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    if path == "/" {
        return Some("the root directory".to_string());
    }
    if let Some(tree) = SYSTEM_TREES.iter().find(|tree| within(path, tree)) {
        return Some(format!("in the system tree `{tree}`"));
    }
    if SHARED_PARENTS.contains(&path) {
        return Some("a directory that holds other users' and services' directories".into());
    }
    if within(path, prefix) || within(prefix, path) {
        return Some(format!(
            "the conda prefix `{prefix}`, in it or a directory that holds it"
        ));
    }
    if !root && within(path, "/root") {
        return Some("root's home".to_string());
    }
    None
}

/// An absolute path with its empty and `.` components dropped (`..` is refused before).
fn normal_path(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::recipe::{Recipe, RecipeOptions};

    fn parse(accounts: &str) -> Result<Recipe, String> {
        let text = format!("[image]\nname = \"x\"\n{accounts}\n");
        Recipe::from_str_at(&text, Path::new("r.toml"), &RecipeOptions::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn users_and_groups_keep_their_order_and_get_defaults() {
        let recipe = parse(
            "[[accounts.groups]]\nname = \"jovyan\"\ngid = 1000\n\
             [[accounts.users]]\nname = \"jovyan\"\nuid = 1000\ngid = 1000\n\
             [[accounts.users]]\nname = \"svc\"\nuid = 999\ngid = 0\nhome = \"/srv/svc/\"\nshell = \"/sbin/nologin\"\n",
        )
        .unwrap();
        let accounts = &recipe.accounts;
        assert_eq!(accounts.groups[0].name, "jovyan");
        assert_eq!(accounts.users[0].home, "/home/jovyan");
        assert_eq!(accounts.users[0].shell, "/bin/sh");
        assert_eq!(accounts.users[1].home, "/srv/svc");
        assert_eq!(accounts.users[1].shell, "/sbin/nologin");
        assert!(parse("").unwrap().accounts.is_empty());
    }

    #[test]
    fn bad_accounts_are_refused_at_the_value() {
        let user = |rest: &str| format!("[[accounts.users]]\n{rest}\n");
        for (text, needle, line) in [
            (user("name = \"Root\"\nuid = 1\ngid = 1"), "not a name useradd accepts", 4),
            (user("name = \"a\"\nuid = -1\ngid = 1"), "uid -1 is outside", 5),
            (user("name = \"a\"\nuid = 4294967295\ngid = 1"), "outside", 5),
            (user("name = \"a\"\nuid = 1\ngid = 1\nhome = \"home/a\""), "absolute path", 7),
            (user("name = \"a\"\nuid = 1\ngid = 1\nhome = \"/h/../etc\""), "without `..`", 7),
            (user("name = \"a\"\nuid = 1\ngid = 1\nshell = \"/bin/sh:x\""), "or `:`", 7),
            (user("name = \"a\"\nuid = 1\ngid = 1\nshell = \"/bin/sh\\n\""), "newline", 7),
            (user("name = \"a\"\nuid = 1\ngid = 1\nnope = 1"), "unknown field `nope`", 7),
            (
                user("name = \"a\"\nuid = 1\ngid = 1") + &user("name = \"a\"\nuid = 2\ngid = 1"),
                "user name `a` is given twice in `[accounts]` (first on line 4)",
                8,
            ),
            (
                user("name = \"a\"\nuid = 1\ngid = 1") + &user("name = \"b\"\nuid = 1\ngid = 1"),
                "uid `1` is given twice",
                9,
            ),
            (
                "[[accounts.groups]]\nname = \"g\"\ngid = 5\n[[accounts.groups]]\nname = \"h\"\ngid = 5\n"
                    .to_string(),
                "gid `5` is given twice",
                8,
            ),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(err.contains(&format!("r.toml:{line}:")), "{text}: {err}");
        }
    }
}
