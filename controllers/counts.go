package controllers

import (
	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/strictjson"
)

func countsOfEntry(e *v1alpha1.ShardStatus) v1alpha1.ItemCounts {
	if e == nil {
		return v1alpha1.ItemCounts{}
	}
	return e.ItemCounts
}

// parseFloor reads annotationCountsFloor; a missing or unreadable value is
// no floor.
func parseFloor(annotations map[string]string) v1alpha1.ItemCounts {
	var c v1alpha1.ItemCounts
	if v, ok := annotations[annotationCountsFloor]; ok {
		if err := strictjson.Unmarshal([]byte(v), &c, false); err != nil {
			return v1alpha1.ItemCounts{}
		}
	}
	return c
}
