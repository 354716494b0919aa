package main

import (
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

func TestMain(m *testing.M) {
	log.SetOutput(io.Discard) // the loader's note on the crds/ symlink
	os.Exit(m.Run())
}

// objects are a render decoded into typed Kubernetes objects.
type objects struct {
	crds        []*apiextv1.CustomResourceDefinition
	ns          []*corev1.Namespace
	sa          *corev1.ServiceAccount
	cm          *corev1.ConfigMap
	ds          *appsv1.DaemonSet
	roles       []*rbacv1.Role
	clusterRole *rbacv1.ClusterRole
	// secretsRole and secretsNS are the policy secrets' Role and
	// Namespace (policySecretsNamespace), apart from roles and ns.
	secretsRole *rbacv1.Role
	secretsNS   *corev1.Namespace
	vaps        []*admissionv1.ValidatingAdmissionPolicy
	all         []runtime.Object
}

// strict decodes with client-go's scheme (and the CRD types), refusing
// unknown and duplicate fields: a typo in a template fails here.
var strict = func() runtime.Decoder {
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := apiextv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// render renders the chart with --set expressions for rel and decodes
// every document.
func render(tb testing.TB, rel Release, sets ...string) *objects {
	tb.Helper()
	files, err := renderFiles(rel, sets...)
	if err != nil {
		tb.Fatal(err)
	}
	return decode(tb, files)
}

func renderFiles(rel Release, sets ...string) ([]File, error) {
	ch, err := Load(ChartDir)
	if err != nil {
		return nil, err
	}
	vals, err := ParseValues(nil, sets)
	if err != nil {
		return nil, err
	}
	return Render(ch, vals, rel)
}

func decode(tb testing.TB, files []File) *objects {
	tb.Helper()
	o := &objects{}
	for _, f := range files {
		for i, d := range f.Docs {
			obj, _, err := strict.Decode([]byte(d), nil, nil)
			if err != nil {
				tb.Fatalf("%s document %d: %v\n%s", f.Name, i+1, err, d)
			}
			o.all = append(o.all, obj)
			switch x := obj.(type) {
			case *apiextv1.CustomResourceDefinition:
				o.crds = append(o.crds, x)
			case *corev1.Namespace:
				if x.Name == "membrane-secrets" || strings.HasPrefix(x.Name, "policy-secrets") {
					o.secretsNS = x
					continue
				}
				o.ns = append(o.ns, x)
			case *corev1.ServiceAccount:
				o.sa = x
			case *corev1.ConfigMap:
				o.cm = x
			case *appsv1.DaemonSet:
				o.ds = x
			case *rbacv1.Role:
				if x.Name == "membrane-agent-policy-secrets" {
					o.secretsRole = x
					continue
				}
				o.roles = append(o.roles, x)
			case *rbacv1.ClusterRole:
				o.clusterRole = x
			case *admissionv1.ValidatingAdmissionPolicy:
				o.vaps = append(o.vaps, x)
			}
		}
	}
	if o.cm == nil || o.ds == nil || o.sa == nil || o.clusterRole == nil {
		tb.Fatalf("render lacks the ConfigMap, DaemonSet, ServiceAccount or ClusterRole")
	}
	return o
}

var envRef = regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`)

// agentArgs is the agent container's command with every $(VAR) replaced
// as the kubelet does (the ConfigMap's values, NODE_NAME node-1).
func (o *objects) agentArgs(tb testing.TB) []string {
	tb.Helper()
	c := o.ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := o.cm.Data[ref.Key]
			if !ok || ref.Name != o.cm.Name {
				tb.Fatalf("env %s: ConfigMap %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "node-1"
		default:
			env[e.Name] = e.Value
		}
	}
	var args []string
	for _, a := range c.Command[1:] {
		args = append(args, envRef.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := env[envRef.FindStringSubmatch(m)[1]]
			if !ok {
				tb.Fatalf("%s: %s is not in the container's env", a, m)
			}
			return v
		}))
	}
	return args
}

func (o *objects) hostPaths() map[string]string {
	m := map[string]string{}
	for _, v := range o.ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			m[v.Name] = v.HostPath.Path
		}
	}
	return m
}

// installCNI is the install-cni init container's command line.
func (o *objects) installCNI(tb testing.TB) string {
	tb.Helper()
	for _, c := range o.ds.Spec.Template.Spec.InitContainers {
		if c.Name == "install-cni" {
			return strings.Join(append(slices.Clone(c.Command), c.Args...), " ")
		}
	}
	tb.Fatal("no install-cni init container")
	return ""
}

func hasArgs(tb testing.TB, args []string, want ...string) {
	tb.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			tb.Errorf("agent args lack %s: %q", w, args)
		}
	}
}

func lacksArgPrefix(tb testing.TB, args []string, prefixes ...string) {
	tb.Helper()
	for _, a := range args {
		for _, p := range prefixes {
			if strings.HasPrefix(a, p) {
				tb.Errorf("agent args have %s, want no %s...", a, p)
			}
		}
	}
}

// TestValues: each value changes the rendered objects as documented in
// values.yaml (the agent's resolved command line, volumes, RBAC,
// admission).
func TestValues(t *testing.T) {
	def := DefaultRelease
	for _, tc := range []struct {
		name  string
		sets  []string
		check func(t *testing.T, o *objects, args []string)
	}{
		{"defaults", nil, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--policy-api-groups=membrane.io")
			if grants(o.clusterRole, "cilium.io", "ciliumnetworkpolicies", "watch") {
				t.Errorf("ClusterRole grants cilium.io without policyAPIGroups naming it")
			}
			hasArgs(t, args, "--k8s", "--node-name=node-1", "--datapath=linux", "--ipam=kubernetes", "--routing=tunnel",
				"--masquerade=true", "--cluster-cidr=", "--kube-proxy-replacement=false", "--l7-proxy=", "--dns-proxy=false",
				"--identity-allocation-mode=crd", "--identity-lease-namespace=kube-system", "--k8s-api-server=",
				"--log-level=info", "--log-format=json", "--tunnel-port=8472", "--tunnel-mtu=1450")
			lacksArgPrefix(t, args, "--kvstore", "--etcd-", "--ipv4-range", "--devices", "--socket-lb-cgroup")
			if len(o.ns) != 0 {
				t.Errorf("Namespace rendered without createNamespace")
			}
			if len(o.crds) != 4 || len(o.vaps) != 1 || len(o.roles) != 1 || o.roles[0].Namespace != "kube-system" {
				t.Errorf("crds %d vaps %d roles %v", len(o.crds), len(o.vaps), o.roles)
			}
			for _, c := range append(o.ds.Spec.Template.Spec.InitContainers, o.ds.Spec.Template.Spec.Containers...) {
				if c.Image != "localhost/membrane:dev" || c.ImagePullPolicy != corev1.PullIfNotPresent {
					t.Errorf("container %s: image %s %s", c.Name, c.Image, c.ImagePullPolicy)
				}
			}
			if tl := o.ds.Spec.Template.Spec.Tolerations; len(tl) != 1 || tl[0].Operator != corev1.TolerationOpExists {
				t.Errorf("tolerations %v", tl)
			}
			if o.sa.Namespace != "membrane-system" || o.ds.Namespace != "membrane-system" {
				t.Errorf("namespaces %s %s", o.sa.Namespace, o.ds.Namespace)
			}
		}},
		{"routing native", []string{"routingMode=native"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--routing=native")
		}},
		{"tunnel port and mtu", []string{"tunnelPort=4789", "tunnelMTU=8950"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--tunnel-port=4789", "--tunnel-mtu=8950")
		}},
		{"kube-proxy replacement", []string{"kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1", "devices={eth0,eth1}"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--kube-proxy-replacement=true", "--k8s-api-server=https://10.0.0.1:6443",
				"--socket-lb-cgroup=/run/membrane/cgroupv2", "--devices=eth0,eth1")
			if o.hostPaths()["cgroup2"] != "/sys/fs/cgroup" {
				t.Errorf("no host cgroup2 volume: %v", o.hostPaths())
			}
		}},
		{"api server ipv6", []string{"k8sServiceHost=fd00::1", "k8sServicePort=443"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--k8s-api-server=https://[fd00::1]:443", "--kube-proxy-replacement=false")
			if _, ok := o.hostPaths()["cgroup2"]; ok {
				t.Errorf("cgroup2 volume without kubeProxyReplacement")
			}
		}},
		{"ipam static", []string{"ipam.mode=static", "ipam.ipv4Range=10.1.0.0/24"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--ipam=static", "--ipv4-range=10.1.0.0/24", "--ipv6-range=")
		}},
		{"masquerade off", []string{"masquerade=false"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--masquerade=false")
		}},
		{"cluster cidrs", []string{"clusterCIDRs={10.244.0.0/16,fd00:10::/56}"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--masquerade=true", "--cluster-cidr=10.244.0.0/16,fd00:10::/56")
		}},
		{"l7 proxy", []string{"l7Proxy=true"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--l7-proxy=/usr/local/bin/membrane-proxy", "--dns-proxy=false")
		}},
		{"dns proxy", []string{"dnsProxy=true"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--dns-proxy=true", "--l7-proxy=")
		}},
		{"cilium.io policies", []string{"policyAPIGroups={membrane.io,cilium.io}"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--policy-api-groups=membrane.io,cilium.io")
			if !grants(o.clusterRole, "cilium.io", "ciliumnetworkpolicies", "watch") || !grants(o.clusterRole, "cilium.io", "ciliumclusterwidenetworkpolicies/status", "patch") {
				t.Errorf("ClusterRole %v grants no read of cilium.io policies or patch of their status", o.clusterRole.Rules)
			}
		}},
		{"kvstore identities", []string{"identityAllocationMode=kvstore", "kvstore.endpoints={http://10.0.0.10:2379,http://10.0.0.11:2379}"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--kvstore=etcd", "--etcd-endpoints=http://10.0.0.10:2379,http://10.0.0.11:2379")
			lacksArgPrefix(t, args, "--identity-allocation-mode", "--etcd-ca")
			if len(o.roles) != 0 {
				t.Errorf("lease Role rendered in kvstore mode: %v", o.roles)
			}
		}},
		{"kvstore tls", []string{"identityAllocationMode=kvstore", "kvstore.endpoints={https://etcd:2379}", "kvstore.tlsSecret=etcd-client"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--etcd-ca=/etc/membrane-etcd/ca.crt", "--etcd-cert=/etc/membrane-etcd/tls.crt", "--etcd-key=/etc/membrane-etcd/tls.key")
			found := false
			for _, v := range o.ds.Spec.Template.Spec.Volumes {
				found = found || v.Secret != nil && v.Secret.SecretName == "etcd-client"
			}
			if !found {
				t.Error("no volume of the TLS Secret")
			}
		}},
		{"local identities", []string{"identityAllocationMode=local"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--identity-allocation-mode=local")
			if len(o.roles) != 0 {
				t.Errorf("lease Role rendered for local identities")
			}
		}},
		{"policy secrets namespace", []string{"policySecretsNamespace.name=policy-secrets-x"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--policy-secrets-namespace=policy-secrets-x")
			if o.secretsNS == nil || o.secretsNS.Name != "policy-secrets-x" || o.secretsRole == nil || o.secretsRole.Namespace != "policy-secrets-x" {
				t.Fatalf("namespace %v role %v", o.secretsNS, o.secretsRole)
			}
			if r := o.secretsRole.Rules; len(r) != 1 || !slices.Equal(r[0].Resources, []string{"secrets"}) || !slices.Equal(r[0].Verbs, []string{"get", "list", "watch"}) {
				t.Errorf("secrets Role rules %v", r)
			}
		}},
		{"policy secrets namespace not created", []string{"policySecretsNamespace.create=false"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--policy-secrets-namespace=membrane-secrets")
			if o.secretsNS != nil || o.secretsRole == nil || o.secretsRole.Namespace != "membrane-secrets" {
				t.Errorf("namespace %v role %v", o.secretsNS, o.secretsRole)
			}
		}},
		{"no policy secrets", []string{"policySecretsNamespace.name="}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--policy-secrets-namespace=")
			if o.secretsNS != nil || o.secretsRole != nil {
				t.Errorf("namespace %v role %v rendered without a policy secrets namespace", o.secretsNS, o.secretsRole)
			}
		}},
		{"lease namespace", []string{"identityLeaseNamespace=membrane-leases"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--identity-lease-namespace=membrane-leases")
			if len(o.roles) != 1 || o.roles[0].Namespace != "membrane-leases" {
				t.Errorf("roles %v", o.roles)
			}
		}},
		{"image", []string{"image.repository=registry.example/membrane", "image.tag=v1.2.3", "image.pullPolicy=Always"}, func(t *testing.T, o *objects, args []string) {
			for _, c := range append(o.ds.Spec.Template.Spec.InitContainers, o.ds.Spec.Template.Spec.Containers...) {
				if c.Image != "registry.example/membrane:v1.2.3" || c.ImagePullPolicy != corev1.PullAlways {
					t.Errorf("container %s: image %s %s", c.Name, c.Image, c.ImagePullPolicy)
				}
			}
		}},
		{"resources", []string{"resources.requests.cpu=100m", "resources.limits.memory=512Mi"}, func(t *testing.T, o *objects, args []string) {
			r := o.ds.Spec.Template.Spec.Containers[0].Resources
			if r.Requests.Cpu().String() != "100m" || r.Limits.Memory().String() != "512Mi" {
				t.Errorf("resources %v", r)
			}
		}},
		{"tolerations and nodeSelector", []string{"tolerations[0].key=dedicated", "tolerations[0].operator=Equal", "tolerations[0].value=net",
			"tolerations[0].effect=NoSchedule", "nodeSelector.kubernetes\\.io/os=linux"}, func(t *testing.T, o *objects, args []string) {
			spec := o.ds.Spec.Template.Spec
			if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" || spec.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
				t.Errorf("tolerations %v", spec.Tolerations)
			}
			if spec.NodeSelector["kubernetes.io/os"] != "linux" {
				t.Errorf("nodeSelector %v", spec.NodeSelector)
			}
		}},
		{"no node restriction", []string{"nodeRestriction.enabled=false"}, func(t *testing.T, o *objects, args []string) {
			if len(o.vaps) != 0 {
				t.Errorf("ValidatingAdmissionPolicy rendered with nodeRestriction.enabled=false")
			}
		}},
		{"namespace", []string{"createNamespace=true"}, func(t *testing.T, o *objects, args []string) {
			if len(o.ns) != 1 || o.ns[0].Name != "membrane-system" {
				t.Errorf("namespaces %v", o.ns)
			}
		}},
		{"log", []string{"logLevel=debug", "logFormat=text"}, func(t *testing.T, o *objects, args []string) {
			hasArgs(t, args, "--log-level=debug", "--log-format=text")
		}},
		{"cni paths and cgroup root", []string{"cni.binPath=/home/kubernetes/bin", "cni.confPath=/etc/cni/conf.d",
			"kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1", "cgroup.hostRoot=/sys/fs/cgroup/unified"}, func(t *testing.T, o *objects, args []string) {
			hp := o.hostPaths()
			if hp["cni-bin"] != "/home/kubernetes/bin" || hp["cni-conf"] != "/etc/cni/conf.d" || hp["cgroup2"] != "/sys/fs/cgroup/unified" {
				t.Errorf("host paths %v", hp)
			}
			hasArgs(t, args, "--socket-lb-cgroup=/run/membrane/cgroupv2")
		}},
		{"host ports auto with kpr", []string{"kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1"}, func(t *testing.T, o *objects, args []string) {
			if got := o.installCNI(t); got != "/usr/local/bin/membrane-agent install-cni --host-ports bpf" {
				t.Errorf("install-cni command %q", got)
			}
		}},
		{"host ports auto without kpr", nil, func(t *testing.T, o *objects, args []string) {
			if got := o.installCNI(t); got != "/usr/local/bin/membrane-agent install-cni" {
				t.Errorf("install-cni command %q", got)
			}
		}},
		{"host ports portmap", []string{"hostPorts=portmap"}, func(t *testing.T, o *objects, args []string) {
			if got := o.installCNI(t); got != "/usr/local/bin/membrane-agent install-cni --host-ports portmap" {
				t.Errorf("install-cni command %q", got)
			}
		}},
		{"host ports none with kpr", []string{"hostPorts=none", "kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1"}, func(t *testing.T, o *objects, args []string) {
			if got := o.installCNI(t); got != "/usr/local/bin/membrane-agent install-cni" {
				t.Errorf("install-cni command %q", got)
			}
		}},
		{"agent capabilities", []string{"securityContext.capabilities.agent={NET_ADMIN,BPF,SYS_ADMIN}"}, func(t *testing.T, o *objects, args []string) {
			sc := o.ds.Spec.Template.Spec.Containers[0].SecurityContext
			if got := fmt.Sprint(sc.Capabilities.Add); got != "[NET_ADMIN BPF SYS_ADMIN]" || fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" {
				t.Errorf("capabilities %v", sc.Capabilities)
			}
		}},
		{"cni mtu", []string{"cni.mtu=1400"}, func(t *testing.T, o *objects, args []string) {
			if c := o.cm.Data["05-membrane.conflist"]; !strings.Contains(c, `"mtu": 1400`) {
				t.Errorf("conflist %s", c)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := render(t, def, tc.sets...)
			tc.check(t, o, o.agentArgs(t))
		})
	}
}

// TestReleaseNamespace: the release's namespace is every namespaced
// object's and the admission policy's ServiceAccount.
func TestReleaseNamespace(t *testing.T) {
	o := render(t, Release{Name: "m", Namespace: "kube-system"})
	if o.sa.Namespace != "kube-system" || o.ds.Namespace != "kube-system" || o.cm.Namespace != "kube-system" {
		t.Fatalf("namespaces: sa %s ds %s cm %s", o.sa.Namespace, o.ds.Namespace, o.cm.Namespace)
	}
	if e := o.vaps[0].Spec.MatchConditions[0].Expression; !strings.Contains(e, "system:serviceaccount:kube-system:membrane-agent") {
		t.Fatalf("admission policy matches %s", e)
	}
}

// TestConfigChecksum: a changed flag changes the pod template (the agents
// roll), an unrelated value does not.
func TestConfigChecksum(t *testing.T) {
	sum := func(sets ...string) string {
		return render(t, DefaultRelease, sets...).ds.Spec.Template.Annotations["membrane.io/config-checksum"]
	}
	base := sum()
	if base == "" || sum("dnsProxy=true") == base {
		t.Fatalf("checksum %q does not follow the configuration", base)
	}
	if sum("resources.requests.cpu=1") != base {
		t.Fatal("checksum changed without a configuration change")
	}
}

// TestBadValues: impossible values fail the render with a message naming
// the value.
func TestBadValues(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"routingMode=vxlan"}, `routingMode "vxlan": want tunnel or native`},
		{[]string{"identityAllocationMode=kvstore"}, "identityAllocationMode kvstore needs kvstore.endpoints"},
		{[]string{"kvstore.endpoints={http://e:2379}"}, `kvstore.endpoints/tlsSecret are set but identityAllocationMode is "crd"`},
		{[]string{"identityAllocationMode=kvstore", "kvstore.endpoints={e:2379}"}, `kvstore.endpoints: "e:2379": want http://host:port`},
		{[]string{"identityAllocationMode=kvstore", "kvstore.endpoints={http://e:2379}", "kvstore.tlsSecret=s"}, "every endpoint must be https://"},
		{[]string{"identityAllocationMode=etcd"}, `identityAllocationMode "etcd": want crd, kvstore or local`},
		{[]string{"kubeProxyReplacement=true"}, "kubeProxyReplacement needs k8sServiceHost"},
		{[]string{"devices={eth0}"}, "devices is for kubeProxyReplacement"},
		{[]string{"k8sServiceHost=10.0.0.1", "k8sServicePort=70000"}, "k8sServicePort 70000: want 1..65535"},
		{[]string{"ipam.mode=cluster-pool"}, `ipam.mode "cluster-pool": want kubernetes`},
		{[]string{"ipam.mode=static"}, "ipam.mode static needs ipam.ipv4Range or ipam.ipv6Range"},
		{[]string{"ipam.ipv4Range=10.0.0.0/24"}, "ipam.ipv4Range/ipv6Range are for ipam.mode static"},
		{[]string{"tunnelMTU=9999999"}, "tunnelMTU 9999999: want 1280..65485"},
		{[]string{"tunnelPort=0"}, "tunnelPort 0: want 1..65535"},
		{[]string{"cni.mtu=100"}, "cni.mtu 100: want 576..65535"},
		{[]string{"image.tag="}, "image.tag is empty"},
		{[]string{"image.pullPolicy=Sometimes"}, `image.pullPolicy "Sometimes": want Always, IfNotPresent or Never`},
		{[]string{"logLevel=trace"}, `logLevel "trace": want debug, info, warn or error`},
		{[]string{"logFormat=xml"}, `logFormat "xml": want text or json`},
		// values.schema.json: misspelt keys and wrong types.
		{[]string{"routingmode=native"}, "additional properties 'routingmode' not allowed"},
		{[]string{"ipam.range=10.0.0.0/24"}, "at '/ipam': additional properties 'range' not allowed"},
		{[]string{"masquerade=yes"}, "at '/masquerade': got string, want boolean"},
		{[]string{"cni.binPath=opt/cni/bin"}, "/cni/binPath"},
		{[]string{"hostPorts=iptables"}, `hostPorts "iptables": want auto, bpf, portmap or none`},
		{[]string{"hostPorts=bpf"}, "hostPorts bpf needs kubeProxyReplacement"},
		{[]string{"policySecretsNamespace.name=Secrets"}, `policySecretsNamespace.name "Secrets": not a namespace name`},
		{[]string{"policySecretsNamespace.name=membrane-system"}, `policySecretsNamespace.name "membrane-system" is the release's namespace`},
	} {
		t.Run(strings.Join(tc.sets, ","), func(t *testing.T) {
			_, err := renderFiles(DefaultRelease, tc.sets...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestCRDsAreDeployCRDs: the chart's crds/ is deploy/crds (generated from
// the Go types), file for file.
func TestCRDsAreDeployCRDs(t *testing.T) {
	files, err := renderFiles(DefaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	want, err := filepath.Glob("../../deploy/crds/*.yaml")
	if err != nil || len(want) == 0 {
		t.Fatalf("deploy/crds: %v %v", want, err)
	}
	var got []string
	for _, f := range files {
		if strings.HasPrefix(f.Name, "crds/") {
			got = append(got, filepath.Base(f.Name))
		}
	}
	for i := range want {
		want[i] = filepath.Base(want[i])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("chart CRDs %v, deploy/crds %v", got, want)
	}
}

// TestManifestsCurrent: deploy/kubernetes is the rendering of the chart's
// defaults (make manifests rewrites it).
func TestManifestsCurrent(t *testing.T) {
	ch, err := Load(ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := ManifestFiles(ch, DefaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckManifests("../../deploy/kubernetes", files); err != nil {
		t.Fatal(err)
	}
	o := decode(t, []File{{Name: "all", Docs: splitDocs(string(files["crds.yaml"]) + "\n---\n" + string(files["membrane.yaml"]) +
		"\n---\n" + string(files["rbac.yaml"]) + "\n---\n" + string(files["admission.yaml"]))}})
	if len(o.ns) != 1 || len(o.crds) != 4 || len(o.vaps) != 1 {
		t.Fatalf("manifests: %d namespaces, %d CRDs, %d admission policies", len(o.ns), len(o.crds), len(o.vaps))
	}
}

// TestCheckManifests: a hand edit, a missing file and a stale generated
// file each fail the check, naming the file.
func TestCheckManifests(t *testing.T) {
	ch, err := Load(ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := ManifestFiles(ch, DefaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteManifests(dir, files); err != nil {
		t.Fatal(err)
	}
	if err := CheckManifests(dir, files); err != nil {
		t.Fatalf("fresh manifests: %v", err)
	}
	edited := strings.Replace(string(files["membrane.yaml"]), "maxUnavailable: 1", "maxUnavailable: 2", 1)
	if err := os.WriteFile(filepath.Join(dir, "membrane.yaml"), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckManifests(dir, files); err == nil || !strings.Contains(err.Error(), "membrane.yaml differs") || !strings.Contains(err.Error(), "maxUnavailable: 2") {
		t.Fatalf("edited: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old.yaml"), files["admission.yaml"], 0o644); err != nil {
		t.Fatal(err)
	}
	err = CheckManifests(dir, files)
	if err == nil || !strings.Contains(err.Error(), "rbac.yaml is missing") || !strings.Contains(err.Error(), "old.yaml is generated but no longer rendered") {
		t.Fatalf("missing and stale: %v", err)
	}
	if err := WriteManifests(dir, files); err != nil {
		t.Fatal(err)
	}
	if err := CheckManifests(dir, files); err != nil {
		t.Fatalf("rewritten: %v", err)
	}
}

// grants reports whether r has a rule granting verb on resource of group.
func grants(r *rbacv1.ClusterRole, group, resource, verb string) bool {
	for _, rule := range r.Rules {
		if slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) {
			return true
		}
	}
	return false
}
