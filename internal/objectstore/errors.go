package objectstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
)

// PermanentError is an answer of the store (or of the way to it) that
// retrying cannot change: bad input for the run.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent reports whether err is a *PermanentError.
func Permanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// TransientError is a failure of the store, or of the way to it, that a
// later try may not meet: a timeout, a 5xx, a connection refused, a read
// that broke off for good, an object replaced while it was read.
type TransientError struct{ Err error }

func (e *TransientError) Error() string { return e.Err.Error() }
func (e *TransientError) Unwrap() error { return e.Err }

// Transient reports whether err is a *TransientError (and no
// *PermanentError).
func Transient(err error) bool {
	var t *TransientError
	return errors.As(err, &t) && !Permanent(err)
}

// hints explain the store's refusals that retrying cannot change, by the
// error code S3 gives (HEAD answers carry no code: its status then).
var hints = map[string]string{
	"NoSuchBucket":                 "the bucket does not exist",
	"NoSuchKey":                    "the object does not exist",
	"NotFound":                     "the object (or its bucket) does not exist",
	"AccessDenied":                 "the credentials may not read it",
	"Forbidden":                    "the credentials may not read it",
	"InvalidAccessKeyId":           "the store knows no such access key",
	"SignatureDoesNotMatch":        "the secret key does not match the access key",
	"InvalidToken":                 "the session token is not valid",
	"ExpiredToken":                 "the session token has expired",
	"PermanentRedirect":            "the bucket is in another region: set object.region (or object.endpoint) to its",
	"AuthorizationHeaderMalformed": "the requests are signed for another region than the bucket's: set object.region",
	"InvalidBucketName":            "the bucket's name is not valid",
	"InvalidObjectState":           "the object is archived and must be restored first",
}

// classify wraps err, what went wrong doing what, as a *PermanentError
// when retrying cannot change it.
func classify(what string, err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		if hint, ok := hints[api.ErrorCode()]; ok {
			return &PermanentError{Err: &hinted{msg: fmt.Sprintf("%s: %s (%s)", what, hint, api.ErrorCode()), cause: err}}
		}
	}
	var resp *awshttp.ResponseError
	if errors.As(err, &resp) {
		switch code := resp.HTTPStatusCode(); {
		case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
			return &TransientError{Err: fmt.Errorf("%s: %w", what, err)}
		case code >= 400:
			return &PermanentError{Err: fmt.Errorf("%s: the store refused it: %w", what, err)}
		}
	}
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknownCA) || errors.As(err, &host) || errors.As(err, &verify) {
		return &PermanentError{Err: fmt.Errorf("%s: the endpoint's certificate does not verify (object.caConfigMapRef adds a CA): %w", what, err)}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return &PermanentError{Err: fmt.Errorf("%s: the endpoint's host does not exist: %w", what, err)}
	}
	return &TransientError{Err: fmt.Errorf("%s: %w", what, err)}
}

// hinted says what a store's refusal means instead of the client's long
// message (request ids, the operation), and keeps it as the cause.
type hinted struct {
	msg   string
	cause error
}

func (e *hinted) Error() string { return e.msg }
func (e *hinted) Unwrap() error { return e.cause }

func isPreconditionFailed(err error) bool {
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() == "PreconditionFailed" {
		return true
	}
	var resp *awshttp.ResponseError
	return errors.As(err, &resp) && resp.HTTPStatusCode() == http.StatusPreconditionFailed
}
