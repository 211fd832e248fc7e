#!/bin/sh
# host-deps.sh installs the Debian packages that abox's VM layer and its
# end-to-end tests need on the host. It is idempotent: apt is only touched when
# a package is missing, so CI can run it on every build for ~0 s.
#
# Usage: scripts/host-deps.sh [--check]
#   --check  list missing packages and exit 1 if any, install nothing.
#
# Must run as root on Debian 12 (bookworm). Progress goes to stderr.
set -eu

# Why each package is here:
#   qemu-system-x86 qemu-utils        the hypervisor and qemu-img (overlays, import, convert)
#   libvirt-daemon-system             libvirtd, virtlogd, nwfilter and network drivers
#   libvirt-clients                   virsh, used by docs, tests and debugging
#   iptables ebtables                 host FORWARD chains; libvirt's nwfilter drives ebtables
#   nftables                          nft: the per-bridge table that answers refused flows
#   dnsmasq-base                      libvirt insists on the binary even with <dns enable='no'/>
#   genisoimage                       NoCloud seed ISOs (cidata)
#   debootstrap e2fsprogs             `abox base build debian-12` (mke2fs -d)
#   tcpdump                           `abox tap` and e2e assertions
#   tshark dnsutils                   decrypting captures with the TLS key log (tests); dig for the DNS demo
#   iproute2 util-linux procps        ip netns, unshare, pkill-free process inspection in e2e
#   openssh-client                    `abox ssh`, `abox scp`, forwards and e2e probes into the guest
#   sshfs                             `abox mount` (guest directories on the host over the instance's SSH)
#   openssh-sftp-server               the real sftp-server the mount hardening test talks to (no daemon)
#   ca-certificates curl              pulling images and test clients
#   gpgv                              `abox base pull` checks a distribution's signed checksum file
#                                     against a keyring on the host (never a key from the server)
#   gpg gpg-agent                     the pull tests make throwaway signing keys with them
PACKAGES="
qemu-system-x86
qemu-utils
libvirt-daemon-system
libvirt-clients
iptables
nftables
ebtables
dnsmasq-base
genisoimage
debootstrap
e2fsprogs
tcpdump
tshark
dnsutils
iproute2
util-linux
procps
openssh-client
sshfs
openssh-sftp-server
ca-certificates
curl
gpgv
gpg
gpg-agent
"

log() { printf 'host-deps: %s\n' "$*" >&2; }

installed() {
	# dpkg-query prints "install ok installed" only for a fully configured package.
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

missing=""
for p in $PACKAGES; do
	installed "$p" || missing="$missing $p"
done

# libvirt 9.0 writes /var/lib/libvirt/dnsmasq/<network>.macs whenever a guest
# starts on a network, but only creates that directory when it runs dnsmasq,
# which abox's networks (<dns enable='no'/>, no DHCP) never do: without it
# every start fails with "Failed to create file ... .macs.new".
ensure_state_dirs() {
	if [ -d /var/lib/libvirt ] && [ ! -d /var/lib/libvirt/dnsmasq ] && [ "$(id -u)" -eq 0 ]; then
		log "creating /var/lib/libvirt/dnsmasq"
		install -d -m 0755 /var/lib/libvirt/dnsmasq
	fi
}

if [ -z "$missing" ]; then
	ensure_state_dirs
	log "all host packages present"
	exit 0
fi

if [ "${1:-}" = "--check" ]; then
	log "missing:$missing"
	exit 1
fi

if [ "$(id -u)" -ne 0 ]; then
	log "missing:$missing (run as root to install)"
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Package scripts try to start services; there is no init system to talk to
# on the build machines, and the tests start libvirtd themselves.
policy=/usr/sbin/policy-rc.d
made_policy=""
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 0755 "$policy"
	made_policy=1
fi
aptlog=$(mktemp /tmp/abox-host-deps.XXXXXX)
cleanup() {
	if [ -n "$made_policy" ]; then rm -f "$policy"; fi
	rm -f "$aptlog"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run_apt() {
	# apt is chatty even with -qq (dpkg's unpack lines): keep its output and
	# show it only when it fails.
	if ! apt-get "$@" >"$aptlog" 2>&1; then
		cat "$aptlog" >&2
		log "apt-get $* failed"
		exit 1
	fi
}
# Another engineer or CI step may be running apt at the same time: wait for
# the dpkg lock instead of failing.
lock="-o DPkg::Lock::Timeout=600"

log "installing:$missing"
log "apt-get update"
# shellcheck disable=SC2086
run_apt -qq $lock update
# shellcheck disable=SC2086 # word splitting is the point
run_apt -qq -y $lock -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
	--no-install-recommends install $missing

still=""
for p in $missing; do
	installed "$p" || still="$still $p"
done
if [ -n "$still" ]; then
	log "still missing after install:$still"
	exit 1
fi
ensure_state_dirs
log "done"
