# Shared helpers for vStellar's shell tools. Source it; it defines functions
# only (and reads config/versions.mk).

VSTELLAR_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Read KEY = value pins from config/versions.mk into the environment, unless
# the caller already set them.
while IFS='=' read -r key value; do
	key=${key%% *}; key=${key%\?}
	value=${value#"${value%%[! ]*}"}
	[[ -z $key || $key == \#* ]] && continue
	[[ -n ${!key:-} ]] || export "$key=$value"
done < "$VSTELLAR_TOP/config/versions.mk"

log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() { printf '%s: error: %s\n' "${0##*/}" "$*" >&2; exit 1; }

# key_of FILE_OR_DIR... : a short hash of the contents of its inputs (paths
# and bytes), used to name cache entries so that changed inputs rebuild.
key_of() {
	local f
	for f in "$@"; do
		if [[ -d $f ]]; then
			(cd "$f" && find . -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z |
				xargs -0 -r sha256sum)
		elif [[ -e $f ]]; then
			printf '%s ' "${f##*/}"; sha256sum < "$f"
		else
			printf '%s\n' "$f"
		fi
	done | sha256sum | cut -c1-16
}

# apt_download_dir DIR: make DIR and let apt's unprivileged download user
# write there (apt otherwise warns that it downloads unsandboxed as root).
apt_download_dir() {
	mkdir -p "$1"
	if id _apt > /dev/null 2>&1; then chown _apt "$1"; fi
}

# fetch_source PKG VERSION [apt-get source options]: download a Debian source
# package once into the cache (apt checks it against the signed index).
fetch_source() {
	local pkg=$1 ver=$2; shift 2
	local dir=$VSTELLAR_CACHE/src
	apt_download_dir "$dir"
	local upstream=${ver#*:}; upstream=${upstream%-*}
	if ! compgen -G "$dir/${pkg}_${upstream}.orig.tar.*" >/dev/null; then
		log "downloading Debian source $pkg=$ver"
		(cd "$dir" && apt-get source -qq --download-only "$@" "$pkg=$ver") ||
			die "apt-get source $pkg=$ver failed (is the deb-src entry there? run: make deps)"
	fi
}

# lock_entry DIR: hold an exclusive lock for building cache entry DIR, so
# that two builds of one key (two clones, make -j) do not unpack into the same
# directory at once. Released when the script exits.
lock_entry() {
	mkdir -p "$(dirname "$1")"
	exec 9> "$1.lock"
	flock 9
}

# prune_cache KIND: keep the VSTELLAR_CACHE_KEEP (default 3) most recently
# used KIND-<key> entries and remove the others, so that changing inputs do
# not fill the disk (a QEMU entry is about 500 MB). Use is recorded by
# touching the entry's .complete; an entry being built (locked) is kept, and
# so is one used in the last hour: several clones or worktrees building at
# once (each with its own key) must not delete what another one's guests
# are still booting from.
prune_cache() {
	local kind=$1 keep=${VSTELLAR_CACHE_KEEP:-3} dir n=0
	while read -r dir; do
		n=$((n + 1))
		((n <= keep)) && continue
		[[ -n $(find "$dir/.complete" -mmin -60 2>/dev/null) ]] && continue
		(
			flock -n 9 || exit 0
			log "pruning old cache entry $dir"
			rm -rf "$dir" "$dir.lock"
		) 9> "$dir.lock"
	done < <(ls -1dt "$VSTELLAR_CACHE/$kind"-*/.complete 2>/dev/null | sed 's|/\.complete$||')
}
