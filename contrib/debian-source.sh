# Sourced by contrib/git-t0303.sh and contrib/ssh-regress.sh: fetches a Debian source package through
# apt with a private sources list and lists directory, so nothing under /etc or /var/lib/apt changes.
#
#   debian_source_download WORK SPEC [SPEC...]
#
# Writes deb-src entries with the same archives as /etc/apt/sources.list.d/debian.sources, updates
# their lists into WORK/lists and runs `apt-get source --download-only SPEC` in WORK/download for the
# first SPEC that works (e.g. "git=1:2.39.5-*", then "git"). On failure it calls the caller's
# `cannot MESSAGE` function (which exits 77: cannot run here).
debian_source_download() {
    local work="$1"
    shift
    local sources=/etc/apt/sources.list.d/debian.sources
    [ -r "$sources" ] || cannot "no $sources to take Debian's archive from"
    # The same archive entries, as deb-src.
    sed 's/^Types:.*/Types: deb-src/' "$sources" > "$work/src.sources"
    mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/download"
    # The system's update hooks are for its own lists (Debian's docker-clean deletes the system's
    # downloaded .debs; PackageKit and AppStream refresh): none of them runs for ours.
    printf '#clear APT::Update::Pre-Invoke;\n#clear APT::Update::Post-Invoke;\n#clear APT::Update::Post-Invoke-Success;\n' > "$work/apt.conf"
    local apt=(apt-get -q -c "$work/apt.conf" -o Dir::Etc::sourcelist="$work/src.sources" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$work/lists"
               -o Dir::Cache::Archives="$work/archives" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
               -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
    "${apt[@]}" update > "$work/update.log" 2>&1 || cannot "apt-get update of the source archive failed: $(tail -1 "$work/update.log")"
    ls "$work"/lists/*Sources* > /dev/null 2>&1 \
        || cannot "no source index could be fetched from Debian's archive (no network?): $(grep -m1 -E '^(W|E|Err)' "$work/update.log" || true)"
    local spec
    for spec in "$@"; do
        (cd "$work/download" && "${apt[@]}" source --download-only "$spec" > "$work/source.log" 2>&1) && return 0
    done
    cannot "apt-get source $1 failed: $(tail -1 "$work/source.log")"
}

# debian_source_tree VARIABLE TREE MARKER PACKAGE VERSION FILL SPEC...
#
# Unless TREE/MARKER exists already: downloads the source package (debian_source_download with the
# SPECs) into a work directory beside TREE, finds the upstream tarball PACKAGE_VERSION.orig.tar.*,
# runs the caller's function `FILL ORIG DIR` to unpack what it needs into DIR, and moves DIR to TREE
# atomically: an interrupted run never leaves a half tree behind, a concurrent run that got there
# first keeps its tree (it may be running in it), and a half tree from an older script is moved
# aside. VARIABLE names the environment variable that moves the cache (for the error message).
debian_source_tree() {
    local variable="$1" tree="$2" marker="$3" package="$4" version="$5" fill="$6"
    shift 6
    [ -f "$tree/$marker" ] && return 0
    local cache; cache="$(dirname "$tree")"
    mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] \
        || cannot "$tree is not prepared and $cache is not writable by $(id -un) (set $variable, or run once as its owner)"
    debian_source_work="$(mktemp -d "$cache/.prepare-XXXXXX")"
    trap 'rm -rf "$debian_source_work"' EXIT
    local work="$debian_source_work"
    debian_source_download "$work" "$@"
    local orig; orig="$(ls "$work"/download/"$package"_"$version".orig.tar.* 2>/dev/null | head -1)"
    [ -n "$orig" ] || cannot "the source archive has no $package $version (found: $(ls "$work/download" | tr '\n' ' '))"
    mkdir -p "$work/tree"
    "$fill" "$orig" "$work/tree"
    [ -f "$work/tree/$marker" ] || cannot "$orig has no $marker"
    if [ ! -f "$tree/$marker" ]; then
        rm -rf "$tree.old"
        [ ! -e "$tree" ] || mv -T "$tree" "$tree.old"
        mv -T "$work/tree" "$tree" 2>/dev/null || [ -f "$tree/$marker" ] || cannot "cannot move the prepared tree to $tree"
    fi
    rm -rf "$tree.old" "$work"
    trap - EXIT
}
