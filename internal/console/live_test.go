package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEventColumns: an Event of events.k8s.io/v1, as the controller's
// recorder writes it (eventTime, maybe a series; no lastTimestamp nor
// count), is shown when it was last seen and how often, as kubectl does;
// a core/v1 Event by its lastTimestamp and count.
func TestEventColumns(t *testing.T) {
	at := time.Date(2026, 12, 6, 19, 7, 36, 0, time.UTC)
	created := metav1.NewTime(at.Add(time.Second))
	v1 := corev1.Event{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}, EventTime: metav1.NewMicroTime(at)}
	require.Equal(t, at, eventTime(v1))
	require.EqualValues(t, 1, eventCount(v1))
	v1.Series = &corev1.EventSeries{Count: 4, LastObservedTime: metav1.NewMicroTime(at.Add(time.Minute))}
	require.Equal(t, at.Add(time.Minute), eventTime(v1))
	require.EqualValues(t, 4, eventCount(v1))
	core := corev1.Event{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}, LastTimestamp: metav1.NewTime(at.Add(time.Hour)), Count: 3}
	require.Equal(t, at.Add(time.Hour), eventTime(core))
	require.EqualValues(t, 3, eventCount(core))
}
