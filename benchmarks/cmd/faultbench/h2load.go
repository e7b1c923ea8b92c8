package main

// The overload's open loop speaks HTTP/2 itself: a call is two frames
// written from bytes built once and an answer read for its grpc-status,
// with no goroutine, context or timer of its own. Through grpc-go a call
// cost the generator about 50 µs of its one CPU, so it could not offer
// 10 times what the service decides (its calls then waited in the
// generator and missed their 20 ms there, which measured the generator);
// a busy generator also slows the service's CPU beside it on this host.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// h2conn is one HTTP/2 connection to the service's gRPC port.
type h2conn struct {
	c  net.Conn
	fr *http2.Framer
	bw *bufio.Writer

	mu      sync.Mutex // guards what follows, and writes
	window  int64      // the connection's send window
	more    *sync.Cond // signalled when window grows or the connection ends
	next    uint32     // the next stream id
	pending map[uint32]*h2call
	order   []uint32 // pending streams, oldest first (for the deadline)
	done    []call
	err     error
	unacked int64 // response bytes not yet given back to the server's window
}

type h2call struct {
	start time.Time
	over  bool
}

// headerBlock is the request's HPACK block, the same for every stream:
// its fields are never indexed, so encoding them changes no table.
func headerBlock(authority string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", rlsPath}, {":authority", authority},
		{"content-type", "application/grpc"}, {"te", "trailers"},
		{"grpc-timeout", strconv.FormatInt(envoyDeadline.Milliseconds(), 10) + "m"},
	} {
		// WriteField cannot fail writing to a bytes.Buffer.
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	return buf.Bytes()
}

const rlsPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// dialH2 opens a connection and exchanges settings.
func dialH2(addr string) (*h2conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, err
	}
	bw := bufio.NewWriterSize(c, 64<<10)
	h := &h2conn{c: c, fr: http2.NewFramer(bw, c), bw: bw, window: 65535, next: 1, pending: map[uint32]*h2call{}}
	h.more = sync.NewCond(&h.mu)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	// Answers are small and read at once: a window of 1 GiB, given back
	// as they are read.
	if err := h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		c.Close()
		return nil, err
	}
	if err := h.fr.WriteWindowUpdate(0, 1<<30-65535); err != nil {
		c.Close()
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		c.Close()
		return nil, err
	}
	go h.read()
	return h, nil
}

// send writes call i (its request's gRPC message msg) as a new stream,
// waiting for the server's window when it is spent.
func (h *h2conn) send(block, msg []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.window < int64(len(msg)) && h.err == nil {
		h.more.Wait()
	}
	if h.err != nil {
		return h.err
	}
	id := h.next
	h.next += 2
	h.window -= int64(len(msg))
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
		return err
	}
	if err := h.fr.WriteData(id, true, msg); err != nil {
		return err
	}
	h.pending[id] = &h2call{start: time.Now()}
	h.order = append(h.order, id)
	return nil
}

// flush sends what send wrote, and gives up on the calls older than the
// deadline: DEADLINE_EXCEEDED, and the stream cancelled.
func (h *h2conn) flush(now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for ; n < len(h.order); n++ {
		id := h.order[n]
		c, ok := h.pending[id]
		if !ok {
			continue // answered
		}
		if now.Sub(c.start) < envoyDeadline {
			break
		}
		delete(h.pending, id)
		h.done = append(h.done, call{start: c.start, took: now.Sub(c.start), code: codes.DeadlineExceeded})
		if err := h.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			return err
		}
	}
	h.order = h.order[n:]
	if h.unacked > 1<<20 {
		if err := h.fr.WriteWindowUpdate(0, uint32(h.unacked)); err != nil {
			return err
		}
		h.unacked = 0
	}
	return h.bw.Flush()
}

// inFlight is how many calls await their answer.
func (h *h2conn) inFlight() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pending)
}

// read reads frames until the connection ends.
func (h *h2conn) read() {
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.fail(err)
			return
		}
		h.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				err = h.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				err = h.fr.WritePing(true, f.Data)
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				h.window += int64(f.Increment)
				h.more.Broadcast()
			}
		case *http2.DataFrame:
			h.unacked += int64(len(f.Data()))
			if c := h.pending[f.StreamID]; c != nil {
				c.over = overall(f.Data()) == rlspb.RateLimitResponse_OVER_LIMIT
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				h.finish(f.StreamID, grpcStatus(f))
			}
		case *http2.RSTStreamFrame:
			h.finish(f.StreamID, resetCode(f.ErrCode, h.pending[f.StreamID]))
		case *http2.GoAwayFrame:
			err = fmt.Errorf("GOAWAY %v", f.ErrCode)
		}
		if err == nil {
			err = h.bw.Flush()
		}
		h.mu.Unlock()
		if err != nil {
			h.fail(err)
			return
		}
	}
}

// finish records the answer of stream id, if it is still awaited. h.mu
// is held.
func (h *h2conn) finish(id uint32, code codes.Code) {
	c, ok := h.pending[id]
	if !ok {
		return
	}
	delete(h.pending, id)
	h.done = append(h.done, call{start: c.start, took: time.Since(c.start), code: code, over: c.over})
}

// resetCode is the code of a call whose stream the server reset: a
// grpc-go server cancels a stream whose deadline passed, which is the
// deadline exceeded (the server's timer fired before the generator's
// sweep); any other reset is UNAVAILABLE.
func resetCode(code http2.ErrCode, c *h2call) codes.Code {
	if code == http2.ErrCodeCancel && c != nil && time.Since(c.start) >= envoyDeadline {
		return codes.DeadlineExceeded
	}
	return codes.Unavailable
}

// fail ends the connection: the calls awaited are UNAVAILABLE.
func (h *h2conn) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.err = err
	}
	for id := range h.pending {
		h.finish(id, codes.Unavailable)
	}
	h.more.Broadcast()
}

// close closes the connection and returns its calls.
func (h *h2conn) close() []call {
	h.c.Close()
	h.fail(net.ErrClosed)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

// grpcStatus is the grpc-status of a trailers frame (UNKNOWN without one).
func grpcStatus(f *http2.MetaHeadersFrame) codes.Code {
	for _, hf := range f.Fields {
		if hf.Name == "grpc-status" {
			n, err := strconv.Atoi(hf.Value)
			if err != nil {
				return codes.Unknown
			}
			return codes.Code(n)
		}
	}
	if v := f.PseudoValue("status"); v != "" && v != "200" {
		return codes.Unavailable
	}
	return codes.Unknown
}

// overall reads a RateLimitResponse's overall_code from a DATA frame
// holding its whole gRPC message (5 bytes of prefix, then the message).
func overall(data []byte) rlspb.RateLimitResponse_Code {
	if len(data) < 5 {
		return rlspb.RateLimitResponse_UNKNOWN
	}
	var resp rlspb.RateLimitResponse
	if err := (lean{}).Unmarshal(data[5:], &resp); err != nil {
		return rlspb.RateLimitResponse_UNKNOWN
	}
	return resp.OverallCode
}

// grpcMessage frames a request's bytes as a gRPC message.
func grpcMessage(b []byte) []byte {
	msg := make([]byte, 5+len(b))
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(b)))
	copy(msg[5:], b)
	return msg
}

// h2Loop offers rate calls a second over conns new connections to addr
// until stop is called, which returns every call. inFlight follows the
// calls awaiting their answer.
func h2Loop(addr string, conns int, rate float64, inFlight *atomic.Int64) (stop func() []call, err error) {
	var cs []*h2conn
	for range conns {
		h, err := dialH2(addr)
		if err != nil {
			for _, h := range cs {
				h.close()
			}
			return nil, err
		}
		cs = append(cs, h)
	}
	block := headerBlock(addr)
	msgs := make([][]byte, 0, len(requests))
	request(0) // builds them
	for _, r := range requests {
		msgs = append(msgs, grpcMessage(wire[r]))
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		for sent := 0; ; {
			select {
			case <-quit:
				return
			default:
			}
			now := time.Now()
			for due := int(rate * now.Sub(start).Seconds()); sent < due; sent++ {
				if cs[sent%len(cs)].send(block, msgs[sent%len(msgs)]) != nil {
					return
				}
			}
			n := 0
			for _, h := range cs {
				if h.flush(now) != nil {
					return
				}
				n += h.inFlight()
			}
			inFlight.Store(int64(n))
			time.Sleep(200 * time.Microsecond)
		}
	}()
	return func() []call {
		close(quit)
		<-finished
		// The calls still awaited get their deadline.
		for end := time.Now().Add(envoyDeadline + 10*time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			for _, h := range cs {
				h.flush(time.Now())
			}
		}
		var out []call
		for _, h := range cs {
			out = append(out, h.close()...)
		}
		return out
	}, nil
}
