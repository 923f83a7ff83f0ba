# Sourced by the probes in scripts/ (B: the build directory, set before).
# probe_dirs: T, a temp directory (711) holding d/ (755) for kvtierd and py/ with the
# build's kvtier package, readable by every user (the probes run tenants as uid 65534).
probe_dirs() {
  T=$(mktemp -d); chmod 711 $T; mkdir -p $T/d $T/py; chmod 755 $T/d
  cp -r $B/python/kvtier $T/py/; chmod -R a+rX $T/py
}
# memory_cgroup NAME: makes a memory cgroup NAME-$$ below this process's (cgroup v1 or
# v2): CG its directory, USAGE the file of its bytes charged. Needs root.
memory_cgroup() {
  if [ -e /sys/fs/cgroup/memory/cgroup.procs ]; then
    local own=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
    CG=/sys/fs/cgroup/memory${own%/}/$1-$$; USAGE=memory.usage_in_bytes
  else
    CG=/sys/fs/cgroup/$1-$$; USAGE=memory.current
  fi
  mkdir $CG || exit 1
}
