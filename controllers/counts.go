package controllers

import (
	"encoding/json"

	"github.com/runledger/runledger/api/v1alpha1"
)

// counts are the item counts of a shard or a run.
type counts struct {
	Total          int64 `json:"total"`
	Completed      int64 `json:"completed"`
	AlreadyHandled int64 `json:"alreadyHandled"`
	Failed         int64 `json:"failed"`
}

// maxEach is the field-wise maximum of c and o.
func (c counts) maxEach(o counts) counts {
	return counts{
		Total:          max(c.Total, o.Total),
		Completed:      max(c.Completed, o.Completed),
		AlreadyHandled: max(c.AlreadyHandled, o.AlreadyHandled),
		Failed:         max(c.Failed, o.Failed),
	}
}

func (c counts) add(o counts) counts {
	return counts{
		Total:          c.Total + o.Total,
		Completed:      c.Completed + o.Completed,
		AlreadyHandled: c.AlreadyHandled + o.AlreadyHandled,
		Failed:         c.Failed + o.Failed,
	}
}

func countsOfReport(r v1alpha1.ShardReport) counts {
	return counts{Total: r.Total, Completed: r.Completed, AlreadyHandled: r.AlreadyHandled, Failed: r.Failed}
}

func countsOfEntry(e *v1alpha1.ShardStatus) counts {
	if e == nil {
		return counts{}
	}
	return counts{Total: e.Total, Completed: e.Completed, AlreadyHandled: e.AlreadyHandled, Failed: e.Failed}
}

func countsOfStatus(s *v1alpha1.ProcessingRunStatus) counts {
	return counts{Total: s.Total, Completed: s.Completed, AlreadyHandled: s.AlreadyHandled, Failed: s.Failed}
}

// parseFloor reads annotationCountsFloor; a missing or unreadable value is
// no floor.
func parseFloor(annotations map[string]string) counts {
	var c counts
	if v, ok := annotations[annotationCountsFloor]; ok {
		if err := json.Unmarshal([]byte(v), &c); err != nil {
			return counts{}
		}
	}
	return c
}
