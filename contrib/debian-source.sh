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
