package event

// Claim check: a message whose data is over a deployment's threshold
// travels without it. The data (the encoded CloudEvent, exactly the bytes
// the message would have carried) is stored as an object, and the message
// keeps its attributes and names the object in AttrClaimCheck; a consumer
// fetches the object and reads the message as if the data had come with
// it (docs/producing.md, "Large payloads").
const (
	// AttrClaimCheck names the object that holds the message's data:
	// gs://<bucket>/<topic>/<event id>, or file://<dir>/<topic>/<event id>
	// locally.
	AttrClaimCheck = "claim_check"
	// AttrClaimCheckSize is the data's length in bytes, decimal.
	AttrClaimCheckSize = "claim_check_size"
	// AttrClaimCheckSHA256 is the data's SHA-256, lowercase hex: a consumer
	// refuses an object whose bytes are not the ones that were published.
	AttrClaimCheckSHA256 = "claim_check_sha256"

	// ReasonClaimCheck: the message names a claim-checked object that
	// cannot be read (missing, altered, or no store configured); the
	// dead letter's reason.
	ReasonClaimCheck = "claim_check"

	// MaxClaimCheckPayload is the largest payload relaybus accepts when
	// it travels by claim check (32 MiB): the outbox's limit, and the
	// publish function's largest PUBLISH_MAX_PAYLOAD_BYTES with a claim
	// check configured. Without one, MaxPayloadLimit is the limit.
	MaxClaimCheckPayload = 32 << 20
)
