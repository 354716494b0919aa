package bpf

// Regenerate with `make generate` (needs clang and libbpf-dev; see doc.go).
// The -I names Debian's multiarch directory for <asm/types.h>.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel,bpfeb -go-package bpf -type ipcache_key -type ipcache_value -type policy_key -type policy_value -type cidr_key -type cidr_value -type ct_key -type ct_value -type drop_key -type drop_value -type drop_event -type drop_reason -type flow_event -type flow_config_value -type flow_stats_value -type node_config_value -type host_safe_key -type endpoint_info -type tunnel_endpoint -type lb_key -type lb_service -type lb_slot_key -type lb_backend -type lb_tuple -type lb_ct_value -type lb_revnat_value -type lb_affinity_key -type lb_affinity_value -type lb_nat_value -type lb_natrev_value -type lb_sock_key -type lb_sock_value Endpoint endpoint.c -- -I.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel,bpfeb -go-package bpf -type tunnel_value -type tunnel_endpoint Overlay overlay.c -- -I.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel,bpfeb -go-package bpf Sock sock.c -- -I.
