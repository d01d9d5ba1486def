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

# The cache: each build script keeps its result in $VSTELLAR_CACHE/KIND-<key>,
# the key a hash of every input, so that a changed input makes a new entry
# and an unchanged one is reused by every clone. An entry is published by
# its .complete file, written last: a reader never sees a half-built entry.
#
#   cache_begin KIND RESULT INPUT...
#     RESULT is the path, inside the entry, that the script prints ("." for
#     the entry itself). The key hashes the INPUTs (files, trees or strings:
#     the pins from config/versions.mk, flags and sources the result is made
#     from), the calling script and this file. When the entry is complete it
#     is marked used (prune_cache keeps the most recently used), RESULT is
#     printed and the script exits. Otherwise the entry is locked (a second
#     build of the same key, from another clone or make -j, waits and then
#     finds it complete), emptied, and CACHE_ENTRY names it for the build to
#     fill.
#   cache_commit [KEEP]
#     Publishes the entry, prunes the kind to its KEEP most recently used
#     entries (default VSTELLAR_CACHE_KEEP, 3) and prints RESULT.
cache_begin() {
	local kind=$1 result=$2; shift 2
	CACHE_KIND=$kind
	CACHE_ENTRY=$VSTELLAR_CACHE/$kind-$(key_of "$@" "$0" "${BASH_SOURCE[0]}")
	CACHE_RESULT=$CACHE_ENTRY/$result; CACHE_RESULT=${CACHE_RESULT%/.}
	cache_use_if_complete && exit 0
	mkdir -p "$VSTELLAR_CACHE"
	exec 9> "$CACHE_ENTRY.lock"
	flock 9
	cache_use_if_complete && exit 0
	rm -rf "$CACHE_ENTRY" && mkdir -p "$CACHE_ENTRY"
}

cache_use_if_complete() {
	[[ -e $CACHE_ENTRY/.complete && -e $CACHE_RESULT ]] || return 1
	touch "$CACHE_ENTRY/.complete"
	echo "$CACHE_RESULT"
}

cache_commit() {
	touch "$CACHE_ENTRY/.complete"
	VSTELLAR_CACHE_KEEP=${1:-${VSTELLAR_CACHE_KEEP:-3}} prune_cache "$CACHE_KIND"
	echo "$CACHE_RESULT"
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

# getdeb PKG VERSION [ARCH]: the .deb in $VSTELLAR_CACHE/debs, downloaded
# once (apt checks it against the signed index).
getdeb() {
	local pkg=$1 ver=$2 arch=${3:-$(dpkg --print-architecture)}
	local debs=$VSTELLAR_CACHE/debs
	apt_download_dir "$debs"
	# apt names files PKG_VERSION_ARCH.deb with an epoch's colon as %3a.
	local f=$debs/${pkg}_${ver/:/%3a}_$arch.deb
	if [[ ! -f $f ]]; then
		# Into a directory of its own, then renamed: `make test` fetches
		# the guest image's packages in the background while the build
		# may ask for the same ones, and apt-get download writes its file
		# in place, so a half-written one must never carry the final name.
		local tmp
		tmp=$(mktemp -d "$debs/.download.XXXXXX")
		apt_download_dir "$tmp"
		(cd "$tmp" && apt-get download -qq "$pkg=$ver") && mv -f "$tmp/${f##*/}" "$f" ||
			{ rm -rf "$tmp"; die "apt-get download $pkg=$ver failed (run: make deps)"; }
		rm -rf "$tmp"
	fi
	[[ -f $f ]] || die "apt-get download $pkg=$ver did not give $f"
	echo "$f"
}

# deb_closure PKG...: "package version arch" lines, sorted, for the PKGs and
# the closure of their Depends and Pre-Depends (apt's --important tree). The
# walk does not enter a package that is a key of the associative array
# DEB_STOP, which the caller declares: what the image has from elsewhere or
# must not carry.
deb_closure() {
	local -A dep=() seen=()
	local line pkg= p todo deps
	while IFS= read -r line; do  # apt-cache's tree: "pkg", then "  Depends: dep"
		case $line in
		*Depends:\ \<*) ;;  # virtual (ssh-client): its providers are indented lines
		*Depends:\ *) dep[$pkg]+=" ${line##* }" ;;
		[!\ ]*) pkg=$line ;;
		esac
	done < <(apt-cache depends --recurse --important "$@")
	todo=("$@")
	while ((${#todo[@]})); do
		p=${todo[-1]}; unset 'todo[-1]'
		[[ -n ${seen[$p]:-} || -n ${DEB_STOP[$p]:-} ]] && continue
		seen[$p]=1
		read -ra deps <<< "${dep[$p]:-}"
		todo+=("${deps[@]}")
	done
	apt-cache show --no-all-versions "${!seen[@]}" |
		awk '/^Package: / {p = $2} /^Version: / {v = $2} /^Architecture: / {print p, v, $2}' | sort
}

# copy_needed_libs ROOT LIBPATH [BASE_ROOT]: copy into ROOT, from the host,
# every shared library that an ELF file in ROOT needs and that neither ROOT
# nor BASE_ROOT (the image an overlay goes on) has; LIBPATH is searched
# first. A library found nowhere is a missing package in
# tools/install-deps.sh, not something to skip; one of the host's Debian
# rdma-core (libopenmpi-dev pulls it in) may never stand in for ours.
copy_needed_libs() {
	local root=$1 libpath=$2 base=${3:-$1} f lib what needed_by real todo
	local -A not_from_host=()
	while read -r f; do not_from_host[${f##*/}]=1; done < <(dpkg -L libibverbs1 librdmacm1 \
		ibverbs-providers 2>/dev/null | grep '\.so')
	# ldd lists the whole closure of a file's libraries, so the first pass,
	# over every file, finds nearly all; each later pass checks only what the
	# one before it copied, until a pass copies nothing. (Three full passes
	# took 110 of the guest image's 140 s.) One awk reads the output of all
	# the ldd runs of a pass, each after an "@ FILE" line.
	todo=$(mktemp)
	find "$root" -type f \( -perm -u+x -o -name '*.so*' \) > "$todo"
	while [[ -s $todo ]]; do
		tr '\n' '\0' < "$todo" | xargs -0 file -N -F' ' |
			awk '/ ELF / && /dynamically linked|shared object/ {print $1}' |
			while read -r elf; do
				echo "@ ${elf#"$root"}"
				LD_LIBRARY_PATH=$libpath ldd "$elf" 2>/dev/null || true
			done |
			awk '/^@ / {elf = $2; next} /=> not found/ {print "MISSING " $1 " " elf}
				/=> \// {print $3} /^\t\/lib64/ {print $1}' |
			sort -u | while read -r lib what needed_by; do
				[[ $lib == MISSING ]] && die "$needed_by needs $what, which no installed package provides (add its package to tools/install-deps.sh)"
				case $lib in "$root"/* | "$base"/*) continue ;; esac
				[[ -z ${not_from_host[${lib##*/}]:-} ]] ||
					die "${lib##*/} would come from the host's Debian rdma-core, not from our build"
				[[ -e $root$lib || -e $base$lib ]] && continue
				real=$(readlink -f "$lib")
				for f in "$lib" "$real"; do
					mkdir -p "$root$(dirname "$f")"
					cp -a "$f" "$root$f"
					echo "$root$f"
				done
			done > "$todo.next"
		mv "$todo.next" "$todo"
	done
	rm -f "$todo"
}

# merge_usr_lib ROOT: Debian's merged /usr (/lib -> /usr/lib on the host):
# move what packages put in /lib/x86_64-linux-gnu to /usr/lib and link.
merge_usr_lib() {
	local root=$1
	if [[ -d $root/lib/x86_64-linux-gnu && ! -L $root/lib/x86_64-linux-gnu ]]; then
		mkdir -p "$root/usr/lib/x86_64-linux-gnu"
		cp -a "$root/lib/x86_64-linux-gnu/." "$root/usr/lib/x86_64-linux-gnu/"
		rm -rf "$root/lib/x86_64-linux-gnu"
	fi
}
