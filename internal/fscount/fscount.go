// Package fscount counts the document reads and writes a Firestore
// client's RPCs really carry, the way Firestore bills them, for the
// benchmarks: a written document (a create, update or delete in a Commit
// or BatchWrite, whatever its outcome) is one write; a document read by
// GetDocument, BatchGetDocuments (found or missing) or a query is one
// read, and a query that returns nothing is one read. It counts what
// crossed the wire, not what the code meant to do.
package fscount

import (
	"context"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/firestore/apiv1/firestorepb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Counter counts reads and writes. The zero value is ready.
type Counter struct {
	reads, writes atomic.Int64
	queries       atomic.Int64

	mu sync.Mutex
	// byDoc holds when each document was written (each write's RPC start).
	byDoc map[string][]time.Time
}

// MaxDocWritesPerSecond is the most writes any single document received
// within one second (a sliding window over the times the write RPCs were
// sent), and that document's name.
func (c *Counter) MaxDocWritesPerSecond() (n int, doc string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, ts := range c.byDoc {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		lo := 0
		for hi := range ts {
			for ts[hi].Sub(ts[lo]) >= time.Second {
				lo++
			}
			if k := hi - lo + 1; k > n {
				n, doc = k, name
			}
		}
	}
	return n, doc
}

// ResetDocs forgets the documents' write times counted so far.
func (c *Counter) ResetDocs() {
	c.mu.Lock()
	c.byDoc = nil
	c.mu.Unlock()
}

// wroteDocs notes the documents a Commit or BatchWrite writes.
func (c *Counter) wroteDocs(ws []*pb.Write) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byDoc == nil {
		c.byDoc = map[string][]time.Time{}
	}
	for _, w := range ws {
		name := w.GetUpdate().GetName()
		if name == "" {
			name = w.GetDelete()
		}
		if name == "" {
			name = w.GetTransform().GetDocument()
		}
		c.byDoc[name] = append(c.byDoc[name], now)
	}
}

// Reads and Writes return the counts so far.
func (c *Counter) Reads() int64  { return c.reads.Load() }
func (c *Counter) Writes() int64 { return c.writes.Load() }

// Queries returns how many queries (RunQuery RPCs) were sent so far: the
// requests whose cost grows with the documents the Firestore emulator
// holds, which scans them all to answer one.
func (c *Counter) Queries() int64 { return c.queries.Load() }

// Options returns the client options that route a Firestore client's RPCs
// through the counter (pass them to firestore.NewClient, or ledger.Open).
// With FIRESTORE_EMULATOR_HOST set, the client library dials the emulator
// itself and ignores dial options, so the counter dials it instead, as the
// library would (no TLS, the emulator's "Bearer owner" credentials).
func (c *Counter) Options() []option.ClientOption {
	interceptors := []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.unary), grpc.WithChainStreamInterceptor(c.stream)}
	if addr := os.Getenv("FIRESTORE_EMULATOR_HOST"); addr != "" {
		conn, err := grpc.NewClient(addr, append(interceptors,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(emulatorOwner{}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))...)
		if err == nil {
			return []option.ClientOption{option.WithGRPCConn(conn)}
		}
	}
	var out []option.ClientOption
	for _, o := range interceptors {
		out = append(out, option.WithGRPCDialOption(o))
	}
	return out
}

// emulatorOwner authenticates to the Firestore emulator as its owner.
type emulatorOwner struct{}

func (emulatorOwner) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer owner"}, nil
}

func (emulatorOwner) RequireTransportSecurity() bool { return false }

func (c *Counter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch r := req.(type) {
	case *pb.CommitRequest:
		c.writes.Add(int64(len(r.Writes)))
		c.wroteDocs(r.Writes)
	case *pb.BatchWriteRequest:
		c.writes.Add(int64(len(r.Writes)))
		c.wroteDocs(r.Writes)
	case *pb.GetDocumentRequest:
		c.reads.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *Counter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return s, err
	}
	return &countingStream{ClientStream: s, c: c}, nil
}

// countingStream counts the documents a BatchGetDocuments or RunQuery
// stream returns.
type countingStream struct {
	grpc.ClientStream
	c     *Counter
	query bool
	docs  int64
}

func (s *countingStream) SendMsg(m any) error {
	if _, ok := m.(*pb.RunQueryRequest); ok {
		s.query = true
		s.c.queries.Add(1)
	}
	return s.ClientStream.SendMsg(m)
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		if s.query && s.docs == 0 {
			s.c.reads.Add(1) // a query that returns nothing is one read
			s.docs = -1
		}
		return err
	}
	switch r := m.(type) {
	case *pb.BatchGetDocumentsResponse:
		if r.GetFound() != nil || r.GetMissing() != "" {
			s.c.reads.Add(1)
		}
	case *pb.RunQueryResponse:
		if r.GetDocument() != nil {
			s.docs++
			s.c.reads.Add(1)
		}
	}
	return nil
}
