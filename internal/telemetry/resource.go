package telemetry

// The host's half (see setup.go): the resource that describes the process.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"cloud.google.com/go/compute/metadata"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Resource attribute keys relaybus sets (OpenTelemetry's semantic
// conventions for resources).
const (
	keyServiceName   = attribute.Key("service.name")
	keyInstanceID    = attribute.Key("service.instance.id")
	keyCloudProvider = attribute.Key("cloud.provider")
	keyCloudPlatform = attribute.Key("cloud.platform")
	keyCloudRegion   = attribute.Key("cloud.region")
	keyCloudAccount  = attribute.Key("cloud.account.id")
	keyFaaSName      = attribute.Key("faas.name")
	keyFaaSVersion   = attribute.Key("faas.version")
	keyGCPProject    = attribute.Key("gcp.project_id")
)

// metadataTimeout bounds the one metadata server read at start (the
// region, on Cloud Run when OTEL_RESOURCE_ATTRIBUTES does not give it).
const metadataTimeout = 2 * time.Second

// Resource describes a process outside Cloud Run and without
// OTEL_RESOURCE_ATTRIBUTES: service.name, service.instance.id (a random
// id: every instance writes its own metric series, which the Telemetry API
// keeps apart by it, as Prometheus's instance label) and the project as
// gcp.project_id when known. Benchmarks and tests use it; Setup builds the
// full resource from the environment.
func Resource(service, project string) *resource.Resource {
	return resource.NewSchemaless(baseAttributes(service, project)...)
}

func baseAttributes(service, project string) []attribute.KeyValue {
	var id [8]byte
	_, _ = rand.Read(id[:])
	if service == "" {
		service = "unknown_service"
	}
	kvs := []attribute.KeyValue{keyServiceName.String(service), keyInstanceID.String(hex.EncodeToString(id[:]))}
	if project != "" {
		kvs = append(kvs, keyGCPProject.String(project), keyCloudAccount.String(project))
	}
	return kvs
}

// buildResource is the process's resource, later entries winning as the
// specification orders them: relaybus's (service.name is the function,
// service.instance.id, the project; on Cloud Run cloud.provider gcp,
// cloud.platform gcp_cloud_run, faas.name and faas.version), then
// OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME. On Cloud Run a
// cloud.region that OTEL_RESOURCE_ATTRIBUTES does not give is read from
// the metadata server: the Telemetry API files metrics under
// prometheus_target, whose location is required. The SDK's own attributes
// (telemetry.sdk.*) come first.
func buildResource(ctx context.Context, o Options) (*resource.Resource, error) {
	fromEnv, err := ParseResourceAttributes(o.ResourceAttributes)
	if err != nil {
		return nil, err
	}
	kvs := baseAttributes(o.ServiceName, o.ProjectID)
	if o.CloudRunService != "" {
		kvs = append(kvs, keyCloudProvider.String("gcp"), keyCloudPlatform.String("gcp_cloud_run"), keyFaaSName.String(o.CloudRunService))
		if o.CloudRunRevision != "" {
			kvs = append(kvs, keyFaaSVersion.String(o.CloudRunRevision))
		}
		if !has(fromEnv, keyCloudRegion) {
			if region := cloudRunRegion(ctx); region != "" {
				kvs = append(kvs, keyCloudRegion.String(region))
			}
		}
	}
	kvs = append(kvs, fromEnv...)
	if name := strings.TrimSpace(o.Config.ServiceName); name != "" {
		kvs = append(kvs, keyServiceName.String(name))
	}
	sdk, err := resource.New(ctx, resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	// resource.NewSchemaless keeps the last value of a repeated key.
	return resource.Merge(sdk, resource.NewSchemaless(kvs...))
}

func has(kvs []attribute.KeyValue, k attribute.Key) bool {
	for _, kv := range kvs {
		if kv.Key == k {
			return true
		}
	}
	return false
}

// cloudRunRegion reads the instance's region from the metadata server
// ("projects/<number>/regions/<region>"; GCE_METADATA_HOST names another
// server), or "" when it cannot.
func cloudRunRegion(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, metadataTimeout)
	defer cancel()
	v, err := metadata.NewClient(nil).GetWithContext(ctx, "instance/region")
	if err != nil {
		otel.Handle(fmt.Errorf("telemetry: cloud.region from the metadata server: %w (set it in OTEL_RESOURCE_ATTRIBUTES)", err))
		return ""
	}
	return v[strings.LastIndex(v, "/")+1:]
}

// ParseResourceAttributes reads OTEL_RESOURCE_ATTRIBUTES: comma-separated
// key=value pairs, each value percent-decoded, as the specification's
// resource SDK defines it. A pair without "=", an empty key or a bad
// escape is an error naming the variable (the specification has the whole
// value discarded then; relaybus refuses to start instead, so the mistake
// is seen).
func ParseResourceAttributes(v string) ([]attribute.KeyValue, error) {
	var out []attribute.KeyValue
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	for _, pair := range strings.Split(v, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("telemetry: OTEL_RESOURCE_ATTRIBUTES: %q is not key=value", pair)
		}
		dec, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTEL_RESOURCE_ATTRIBUTES: %s: %w", k, err)
		}
		out = append(out, attribute.String(k, dec))
	}
	return out, nil
}
