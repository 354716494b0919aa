package cni

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// agentClient speaks just enough HTTP/1.1 to the agent's API over its
// unix socket for the plugin: JSON bodies, answers with Content-Length,
// chunked or ending at EOF, one kept-alive connection reused by the next
// request (an ADD makes two). It replaces pkg/clients/client here because net/http
// (and the TLS, HTTP/2 and MIME packages behind it) costs a plugin that is
// exec'd per pod initialisation time and goroutines on every call. Errors
// mirror pkg/clients/client: *apiError for non-2xx answers (code "http-<status>"
// when the body is not an API error), and a *net.OpError with Op "dial"
// when the agent is not there. Safe for concurrent use.
type agentClient struct {
	socket string

	// mu guards idle, a connection whose last answer was complete.
	mu   sync.Mutex
	idle *agentConn
}

type agentConn struct {
	net.Conn
	r *bufio.Reader
}

// close drops the idle connection.
func (c *agentClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle != nil {
		c.idle.Close()
		c.idle = nil
	}
}

// conn returns the idle connection (reused true) or dials a new one.
func (c *agentClient) conn(ctx context.Context) (*agentConn, bool, error) {
	c.mu.Lock()
	ac := c.idle
	c.idle = nil
	c.mu.Unlock()
	if ac != nil {
		return ac, true, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, false, err
	}
	return &agentConn{Conn: conn, r: bufio.NewReader(conn)}, false, nil
}

// release keeps ac for the next request if keep, else closes it.
func (c *agentClient) release(ac *agentConn, keep bool) {
	if keep {
		_ = ac.SetDeadline(time.Time{})
		c.mu.Lock()
		if c.idle == nil {
			c.idle, ac = ac, nil
		}
		c.mu.Unlock()
	}
	if ac != nil {
		ac.Close()
	}
}

// maxAnswer bounds an answer's body.
const maxAnswer = 4 << 20

// apiError is a non-2xx answer of the agent.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("agent: %d %s: %s", e.Status, e.Code, e.Message)
}

// isCode reports whether err is an agent answer with the given code.
func isCode(err error, code string) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == code
}

// isNotFound reports whether err is the agent's 404.
func isNotFound(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Status == 404
}

// do sends one request and decodes a 2xx JSON answer into out (may be nil).
func (c *agentClient) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	_, err := c.doTimed(ctx, method, path, query, body, out)
	return err
}

// doTimed is do that also returns the answer's Server-Timing header.
func (c *agentClient) doTimed(ctx context.Context, method, path string, query url.Values, body, out any) (string, error) {
	req, err := encodeRequest(method, path, query, body)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, path, err)
	}
	a, err := c.roundTrip(ctx, req)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, path, err)
	}
	return a.timing, decodeAnswer(method, path, a.status, a.body, out)
}

// decodeAnswer turns a non-2xx answer into an *apiError and decodes a
// 2xx answer's JSON into out (may be nil).
func decodeAnswer(method, path string, status int, data []byte, out any) error {
	if status/100 != 2 {
		var me models.Error
		if json.Unmarshal(data, &me) != nil || me.Code == "" {
			me = models.Error{Code: "http-" + strconv.Itoa(status), Message: string(data)}
		}
		return &apiError{Status: status, Code: me.Code, Message: me.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// roundTrip sends req and reads the answer. A kept-alive connection the
// agent closed in the meantime (nothing written back) is replaced by a
// new one once.
func (c *agentClient) roundTrip(ctx context.Context, req []byte) (answer, error) {
	for attempt := 0; ; attempt++ {
		ac, reused, err := c.conn(ctx)
		if err != nil {
			return answer{}, err
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = ac.SetDeadline(dl)
		}
		a, err := send(ac, req)
		if err != nil {
			ac.Close()
			if reused && attempt == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
				continue
			}
			return answer{}, err
		}
		c.release(ac, a.keep)
		return a, nil
	}
}

func send(ac *agentConn, req []byte) (answer, error) {
	if _, err := ac.Write(req); err != nil {
		return answer{}, fmt.Errorf("send: %w", err)
	}
	a, err := readAnswer(ac.r)
	if err != nil {
		return answer{}, fmt.Errorf("read answer: %w", err)
	}
	return a, nil
}

func encodeRequest(method, path string, query url.Values, body any) ([]byte, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("encode: %w", err)
		}
	}
	target := path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: membrane\r\nUser-Agent: membrane-cni\r\n", method, target)
	if payload != nil {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(payload))
	}
	b.WriteString("\r\n")
	b.Write(payload)
	return b.Bytes(), nil
}

// answer is an agent's HTTP answer. keep says the connection may carry
// another request (the body's end was framed and the agent did not ask
// to close); timing is its Server-Timing header (POST /v1/attach's
// steps), at most maxTiming bytes.
type answer struct {
	status int
	body   []byte
	keep   bool
	timing string
}

// maxTiming bounds the Server-Timing value kept (the attach's is ~120
// bytes).
const maxTiming = 512

// readAnswer parses an HTTP/1.1 answer: status, headers, body.
func readAnswer(r *bufio.Reader) (answer, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return answer{}, err
	}
	proto, rest, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
	code, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || status < 100 || status > 999 {
		return answer{}, fmt.Errorf("malformed status line %q", line)
	}
	a := answer{status: status, keep: proto == "HTTP/1.1"}
	length, chunked := -1, false
	for {
		h, err := r.ReadString('\n')
		if err != nil {
			return answer{}, err
		}
		h = strings.TrimRight(h, "\r\n")
		if h == "" {
			break
		}
		k, v, _ := strings.Cut(h, ":")
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "content-length":
			if length, err = strconv.Atoi(v); err != nil || length < 0 || length > maxAnswer {
				return answer{}, fmt.Errorf("bad content-length %q", v)
			}
		case "transfer-encoding":
			chunked = strings.EqualFold(v, "chunked")
		case "connection":
			a.keep = a.keep && !strings.EqualFold(v, "close")
		case "server-timing":
			if len(v) <= maxTiming {
				a.timing = v
			}
		}
	}
	a.keep = a.keep && (chunked || length >= 0)
	a.body, err = readBody(r, length, chunked)
	return a, err
}

func readBody(r *bufio.Reader, length int, chunked bool) ([]byte, error) {
	switch {
	case chunked:
		return readChunked(r)
	case length >= 0:
		body := make([]byte, length)
		_, err := io.ReadFull(r, body)
		return body, err
	}
	body, err := io.ReadAll(io.LimitReader(r, maxAnswer+1))
	if err == nil && len(body) > maxAnswer {
		err = fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	return body, err
}

func readChunked(r *bufio.Reader) ([]byte, error) {
	var body []byte
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		sizeHex, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ";")
		size, err := strconv.ParseInt(strings.TrimSpace(sizeHex), 16, 32)
		if err != nil || size < 0 || len(body)+int(size) > maxAnswer {
			return nil, fmt.Errorf("bad chunk size %q", line)
		}
		if size == 0 { // trailers (unused) up to an empty line
			for {
				t, err := r.ReadString('\n')
				if err != nil {
					return nil, err
				}
				if strings.TrimRight(t, "\r\n") == "" {
					return body, nil
				}
			}
		}
		chunk := make([]byte, size+2) // data and CRLF
		if _, err := io.ReadFull(r, chunk); err != nil {
			return nil, err
		}
		body = append(body, chunk[:size]...)
	}
}

// The calls the plugin makes (same paths and bodies as pkg/clients/client).

// attach is POST /v1/attach: the agent does the ADD. It also returns
// the answer's Server-Timing (the agent's steps).
func (c *agentClient) attach(ctx context.Context, req *models.AttachRequest, out *models.AttachResponse) (string, error) {
	return c.doTimed(ctx, "POST", "/v1/attach", nil, req, out)
}

func (c *agentClient) endpointGet(ctx context.Context, ref string) (*models.Endpoint, error) {
	var ep models.Endpoint
	return &ep, c.do(ctx, "GET", "/v1/endpoint/"+url.PathEscape(ref), nil, nil, &ep)
}

// endpointDeleteAttachment deletes the endpoint of one CNI attachment.
func (c *agentClient) endpointDeleteAttachment(ctx context.Context, containerID, ifName string) error {
	req := &models.EndpointBatchDeleteRequest{ContainerID: containerID, ContainerInterfaceName: ifName}
	return c.do(ctx, "DELETE", "/v1/endpoint", nil, req, nil)
}

// attachmentRef names the endpoint of a CNI attachment in API paths.
func attachmentRef(containerID, ifName string) string {
	return "cni-attachment-id:" + containerID + ":" + ifName
}

func (c *agentClient) endpointHealth(ctx context.Context, ref string) error {
	return c.do(ctx, "GET", "/v1/endpoint/"+url.PathEscape(ref)+"/healthz", nil, nil, nil)
}

func (c *agentClient) status(ctx context.Context) (*models.Status, error) {
	var st models.Status
	return &st, c.do(ctx, "GET", "/v1/status", nil, nil, &st)
}

func (c *agentClient) gc(ctx context.Context, valid []models.GCAttachment) error {
	if valid == nil {
		valid = []models.GCAttachment{}
	}
	return c.do(ctx, "POST", "/v1/gc", nil, &models.GCRequest{ValidAttachments: valid}, nil)
}

// retryDelay is the pause between tries while the agent is starting.
const retryDelay = 100 * time.Millisecond
