package policy

import (
	"cmp"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

func TestAllows(t *testing.T) {
	const a, b identity.NumericIdentity = 300, 301
	m := NewMapState(1, true, false, []Key{
		{a, 8080, ProtoTCP, Ingress},
		{b, 0, ProtoUDP, Ingress},
		{identity.ReservedHost, 0, 0, Ingress},
		{0, 53, ProtoUDP, Ingress},
		{a, 8080, ProtoTCP, Ingress}, // duplicate
	})
	if len(m.Allow) != 4 {
		t.Fatalf("Allow = %v, want 4 unique entries", m.Allow)
	}
	tests := []struct {
		name  string
		peer  identity.NumericIdentity
		port  uint16
		proto uint8
		dir   Direction
		want  bool
	}{
		{"exact", a, 8080, ProtoTCP, Ingress, true},
		{"other port", a, 8081, ProtoTCP, Ingress, false},
		{"other proto", a, 8080, ProtoUDP, Ingress, false},
		{"port wildcard", b, 9999, ProtoUDP, Ingress, true},
		{"port wildcard wrong proto", b, 9999, ProtoTCP, Ingress, false},
		{"L3 only", identity.ReservedHost, 1, ProtoSCTP, Ingress, true},
		{"any peer L4", 999, 53, ProtoUDP, Ingress, true},
		{"world denied", identity.ReservedWorld, 80, ProtoTCP, Ingress, false},
		{"egress not enforced", identity.ReservedWorld, 80, ProtoTCP, Egress, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.Allows(tt.peer, tt.port, tt.proto, tt.dir); got != tt.want {
				t.Errorf("Allows(%v, %d, %d, %v) = %v, want %v", tt.peer, tt.port, tt.proto, tt.dir, got, tt.want)
			}
		})
	}
	var none *MapState
	if !none.Allows(1, 2, 3, Egress) || none.Enforced(Ingress) {
		t.Error("nil MapState must allow everything")
	}
}

func TestDiff(t *testing.T) {
	k := func(id identity.NumericIdentity, port uint16) Key { return Key{id, port, ProtoTCP, Ingress} }
	from := NewMapState(1, true, false, []Key{k(1, 80), k(2, 80), k(3, 80)})
	to := NewMapState(2, true, false, []Key{k(2, 80), k(3, 80), k(4, 80), k(0, 443)})
	add, remove := Diff(from, to)
	if want := []Key{k(0, 443), k(4, 80)}; !slices.Equal(add, want) {
		t.Errorf("add = %v, want %v", add, want)
	}
	if want := []Key{k(1, 80)}; !slices.Equal(remove, want) {
		t.Errorf("remove = %v, want %v", remove, want)
	}
	add, remove = Diff(nil, to)
	if !slices.Equal(add, to.Allow) || remove != nil {
		t.Errorf("Diff(nil, to) = %v, %v", add, remove)
	}
	add, remove = Diff(from, nil)
	if add != nil || !slices.Equal(remove, from.Allow) {
		t.Errorf("Diff(from, nil) = %v, %v", add, remove)
	}
	if !from.Equal(NewMapState(9, true, false, []Key{k(3, 80), k(1, 80), k(2, 80)})) {
		t.Error("Equal must ignore revision and input order")
	}
}

// TestKeyPackOrder: packed keys sort as Compare orders keys, and unpack
// undoes pack, at the extremes of every field.
func TestKeyPackOrder(t *testing.T) {
	var keys []Key
	for _, dir := range []Direction{Ingress, Egress} {
		for _, id := range []identity.NumericIdentity{0, 1, 1 << 24, 1<<32 - 1} {
			for _, proto := range []uint8{0, ProtoTCP, 255} {
				for _, port := range []uint16{0, 80, 65535} {
					keys = append(keys, Key{Identity: id, Port: port, Proto: proto, Dir: dir})
				}
			}
		}
	}
	for _, a := range keys {
		if got := unpack(a.pack()); got != a {
			t.Fatalf("unpack(pack(%+v)) = %+v", a, got)
		}
		for _, b := range keys {
			if got, want := cmp.Compare(a.pack(), b.pack()), Compare(a, b); got != want {
				t.Fatalf("packed order of %+v, %+v = %d, Compare = %d", a, b, got, want)
			}
		}
	}
}
