package objectstore

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"testing"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/stretchr/testify/require"
)

func responseError(status int, err error) error {
	return &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: err}}
}

// TestClassify: what retrying cannot change is permanent (bad input for the
// run), with a hint; the rest is transient.
func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		err       error
		permanent bool
		want      string
	}{
		{"no such bucket", &smithy.GenericAPIError{Code: "NoSuchBucket"}, true, "the bucket does not exist (NoSuchBucket)"},
		{"no such key", &smithy.GenericAPIError{Code: "NoSuchKey"}, true, "the object does not exist"},
		{"HEAD 404", responseError(404, &smithy.GenericAPIError{Code: "NotFound"}), true, "does not exist (NotFound)"},
		{"HEAD 403", responseError(403, &smithy.GenericAPIError{Code: "Forbidden"}), true, "the credentials may not read it"},
		{"wrong secret", &smithy.GenericAPIError{Code: "SignatureDoesNotMatch"}, true, "the secret key does not match the access key"},
		{"another region", &smithy.GenericAPIError{Code: "PermanentRedirect"}, true, "set object.region"},
		{"a 4xx without a code", responseError(400, errors.New("bad request")), true, "the store refused it"},
		{"503", responseError(503, &smithy.GenericAPIError{Code: "SlowDown"}), false, ""},
		{"500", responseError(500, errors.New("internal")), false, ""},
		{"429", responseError(429, errors.New("too many")), false, ""},
		{"408", responseError(408, errors.New("timeout")), false, ""},
		{"unknown CA", x509.UnknownAuthorityError{}, true, "the endpoint's certificate does not verify"},
		{"wrong host name", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "s3"}, true, "the endpoint's certificate does not verify"},
		{"no such host", &net.DNSError{Err: "no such host", Name: "s3.invalid", IsNotFound: true}, true, "the endpoint's host does not exist"},
		{"a DNS timeout", &net.DNSError{Err: "timeout", Name: "s3", IsTimeout: true}, false, ""},
		{"connection refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, false, ""},
		{"deadline", context.DeadlineExceeded, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := classify("reading s3://b/k", tt.err)
			require.Equal(t, tt.permanent, Permanent(err), "%v", err)
			require.Equal(t, !tt.permanent, Transient(err), "%v", err)
			require.ErrorIs(t, err, tt.err, "the cause is kept")
			require.Contains(t, err.Error(), "reading s3://b/k: ")
			require.Contains(t, err.Error(), tt.want)
		})
	}
}
